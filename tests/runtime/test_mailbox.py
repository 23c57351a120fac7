"""mailbox.py on 2 gloo ranks (mailbox_worker.py): Note [pipeline messages through shared
memory]. Messages arrive whole whatever the order of posts and waits, in either half of
the slots, shorter than a slot or as long; nothing stays in /dev/shm once the two ranks
hold their files; ``PARC_PIPELINE_SHM=0`` keeps gloo; and an executor's steps give the same
loss and gradients, float for float, through gloo and through the mailbox."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from parc.runtime.parallel.pipeline import mailbox

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("mailbox_ranks", HERE / "ranks.py")
ranks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ranks)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mailbox")
    ranks.launch(HERE / "mailbox_worker.py", 2, [str(folder)], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_messages_arrive_whole_in_any_order(results):
    for rank in results:
        assert rank["alone"]["seen"] == rank["alone"]["expected"]
        assert rank["alone"]["left"] == []  # unlinked once both ends held them
        assert rank["alone"]["off"]  # PARC_PIPELINE_SHM=0: gloo


def test_the_executor_gives_the_same_numbers_through_either(results):
    for rank in results:
        gloo, shm = rank["executor"]["0"], rank["executor"]["1"]
        assert not gloo["mailbox"] and shm["mailbox"]
        assert shm["losses"] == gloo["losses"] and shm["grads"] == gloo["grads"]
    assert results[1]["executor"]["1"]["losses"][0] != 0.0  # the last stage's loss (rank 1 holds stage 3)


def test_no_mailbox_off_the_cpu_or_without_a_group():
    assert mailbox.mailbox_for(None, [0, 1], 0, {1}, numel=4, tags=4, device="cpu") is None
    assert mailbox.mailbox_for(object(), [0, 1], 0, {1}, numel=4, tags=4, device="cuda") is None
