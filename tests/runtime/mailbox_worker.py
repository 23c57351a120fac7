"""One rank of the mailbox test (started by ``ranks.launch`` on 2 gloo ranks).

    python mailbox_worker.py OUT_DIR

Rank 0 and rank 1 are a 2-stage pipeline. First the mailbox alone (mailbox.py, Note
[pipeline messages through shared memory]): three steps of messages both ways, sent in
one order and waited on in another, shorter than a slot and as long as one; what /dev/shm
holds after the set-up; ``PARC_PIPELINE_SHM=0`` gives no mailbox. Then one executor's step
of an interleaved schedule over real stages, its messages once through gloo and once through
the mailbox: the loss and every gradient. Writes what it saw to ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from parc.runtime.distributed import mesh
from parc.runtime.parallel.pipeline import mailbox as mailboxes
from parc.runtime.parallel.pipeline.pipeline import PipelineExecutor
from parc.runtime.schedules.schedule import build_schedule

NUMEL, TAGS = 6, 4


def message(step: int, tag: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) + 100 * step + 10 * tag


def mailbox_alone(rank: int) -> dict:
    before = {name for name in os.listdir("/dev/shm") if name.startswith("parc-pp-")}
    box = mailboxes.mailbox_for(dist.group.WORLD, [0, 1], rank, {1 - rank},
                                numel=NUMEL, tags=TAGS, device="cpu")
    dist.barrier()  # both ranks past the set-up, each having unlinked the files it made
    left = sorted({name for name in os.listdir("/dev/shm") if name.startswith("parc-pp-")} - before)
    seen = []
    for step in range(3):
        box.next_step()
        if rank == 0:  # tags 2, 0, 3 to rank 1 (tag 3 as long as a slot, the others shorter); 1 back
            box.post([(True, message(step, tag, NUMEL if tag == 3 else 4), 1, tag) for tag in (2, 0, 3)])
            buffer = torch.empty(4)
            (posted,) = box.post([(False, buffer, 1, 1)])
            posted.wait()
            seen.append(buffer.tolist())
        else:
            buffers = {tag: torch.empty(NUMEL if tag == 3 else 4) for tag in (3, 0, 2)}
            posts = box.post([(False, buffers[tag], 0, tag) for tag in (3, 0, 2)])  # waited in another order
            for posted in posts:
                posted.wait()
            box.post([(True, message(step, 1, 4), 0, 1)])
            seen.append({tag: buffers[tag].tolist() for tag in sorted(buffers)})
        dist.barrier()  # rank 0 may run a step ahead only as far as the pipeline lets it
    os.environ["PARC_PIPELINE_SHM"] = "0"
    off = mailboxes.mailbox_for(dist.group.WORLD, [0, 1], rank, {1 - rank}, numel=NUMEL, tags=TAGS, device="cpu")
    del os.environ["PARC_PIPELINE_SHM"]
    return {"seen": seen, "left": left, "off": off is None,
            "expected": [(message(s, 1, 4).tolist() if rank == 0 else
                          {tag: message(s, tag, NUMEL if tag == 3 else 4).tolist() for tag in (0, 2, 3)})
                         for s in range(3)]}


class Stage(torch.nn.Module):
    """A layer of the test's pipeline; the last virtual stage returns the mean squared output."""

    def __init__(self, index: int, last: bool):
        super().__init__()
        torch.manual_seed(index)
        self.linear, self.last = torch.nn.Linear(8, 8), last

    def forward(self, x, targets):
        y = torch.tanh(self.linear(x.float() if x.dtype != torch.float32 else x))
        return (y - targets).pow(2).mean() if self.last else y


def executor_both_ways(rank: int) -> dict:
    micro_batches, chunks = 4, 2
    actions = build_schedule("interleaved", stages=2, micro_batches=micro_batches, chunks=chunks)[rank]
    out = {}
    for shm in ("0", "1"):
        os.environ["PARC_PIPELINE_SHM"] = shm
        stages = [Stage(c * 2 + rank, last=c * 2 + rank == 3) for c in range(chunks)]
        runner = PipelineExecutor(stages, actions=actions, pp_group=dist.group.WORLD, pp_ranks=[0, 1], pp_rank=rank,
                                  micro_batches=micro_batches, activation_shape=(2, 8), device=torch.device("cpu"))

        def batch(m):
            g = torch.Generator().manual_seed(m)
            return torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)

        losses = [runner.step(batch) for _ in range(2)]  # two steps: both halves of the slots
        out[shm] = {"mailbox": runner.mailbox is not None, "losses": losses,
                    "grads": [p.grad.tolist() for s in stages for p in s.parameters()]}
    del os.environ["PARC_PIPELINE_SHM"]
    return out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {"alone": mailbox_alone(rank), "executor": executor_both_ways(rank)}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main()
    mesh.shutdown()  # after main's objects are gone (Note [groups die before Python does])
