"""train.py's ``loss_fn`` under a pipeline: ``PipelineExecutor`` calls it on the last stage
with each micro-batch's loss and the chunk, and backward starts from its result, so a loss
term written once in train.py gives, through the executor, the loss and gradients of the
plain loop with the same term (docs/customize.md: a loss term)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_loop import CONFIGS  # noqa: E402

from parc.runtime.parallel.pipeline.pipeline import PipelineExecutor  # noqa: E402
from parc.runtime.schedules.schedule import build_schedule  # noqa: E402
import built  # noqa: E402  (tests/runtime/built.py)

MICRO, B = 2, 2


def _build():
    return built.build(CONFIGS["gpt"], tp_group=None, sequence_parallel=False, tp_plan={}, seed=5,
                       device=torch.device("cpu"), kernels="eager").double()


def loss_fn(loss, model):
    """The guide's term: a penalty on the vectors (norm weights, biases) of ``model``."""
    return loss + 1e-2 * sum(p.pow(2).sum() for p in model.parameters() if p.dim() == 1)


def test_the_executor_backpropagates_loss_fn_of_the_last_stage():
    config = CONFIGS["gpt"]
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, config.vocab, (B, config.seq_len), generator=gen),
                torch.randint(0, config.vocab, (B, config.seq_len), generator=gen)) for _ in range(MICRO)]
    reference = _build()
    expected = sum(loss_fn(reference(x, y), reference) / MICRO for x, y in batches)
    expected.backward()
    plain = _build()
    without = sum(plain(x, y).item() / MICRO for x, y in batches)
    net = _build()
    runner = PipelineExecutor([net], actions=build_schedule("1f1b", stages=1, micro_batches=MICRO)[0],
                              pp_group=None, pp_ranks=[0], pp_rank=0, micro_batches=MICRO,
                              activation_shape=(B, config.seq_len, config.hidden), device=torch.device("cpu"),
                              loss_fn=loss_fn)
    loss = runner.step(batches.__getitem__)
    assert loss == pytest.approx(expected.item(), rel=1e-12) and loss > without + 1e-3  # the term is in
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
