"""TeraPipe in the model (runtime/parallel/pipeline/terapipe.py): a whole model run as one stage through
the executor in token slices (even and uneven) gives the loss and every gradient of the
unsliced forward and backward, in float64, for GPT (learned positions) and Llama
(rotary, grouped-query heads), also under recompute (full, selective: Note [recompute in
a slice]) and with experts (the balance and z losses' gradients and logged values the
micro-batch's: Note [experts in a slice]); and the slice lengths' checks."""

import dataclasses

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_loop import CONFIGS  # noqa: E402

from parc.runtime.models import model  # noqa: E402
from parc.runtime.parallel.pipeline.pipeline import PipelineExecutor  # noqa: E402
from parc.runtime.schedules.schedule import build_schedule  # noqa: E402
from parc.runtime.parallel.pipeline.terapipe import slice_lengths  # noqa: E402
import built  # noqa: E402  (tests/runtime/built.py)

MICRO, B = 2, 2


def _build(arch, recompute=None, config=None):
    return built.build(config or CONFIGS[arch], tp_group=None, sequence_parallel=False, tp_plan={}, seed=5,
                       device=torch.device("cpu"), kernels="eager", recompute=recompute).double()


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("slices,recompute", [(2, None), (4, None), ("uneven", None), ("uneven", "full"),
                                              (4, "selective"), (2, "[full, selective]")])
def test_sliced_step_equals_whole_sequences(arch, slices, recompute):
    config = CONFIGS[arch]
    T = config.seq_len
    lengths = slice_lengths(T, slices if slices != "uneven" else (T // 2, T // 4, T - T // 2 - T // 4))
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, config.vocab, (B, T), generator=gen),
                torch.randint(0, config.vocab, (B, T), generator=gen)) for _ in range(MICRO)]
    reference = _build(arch)
    expected = sum(reference(x, y) / MICRO for x, y in batches)
    expected.backward()
    if recompute is not None and recompute.startswith("["):  # one mode per block
        recompute = [mode.strip() for mode in recompute[1:-1].split(",")][:config.layers]
        recompute += ["none"] * (config.layers - len(recompute))
    net = _build(arch, recompute)
    actions = build_schedule("terapipe", stages=1, micro_batches=MICRO, slices=len(lengths))[0]
    runner = PipelineExecutor([net], actions=actions, pp_group=None, pp_ranks=[0], pp_rank=0,
                              micro_batches=MICRO, activation_shape=(B, T, config.hidden),
                              device=torch.device("cpu"), slices=lengths)
    loss = runner.step(batches.__getitem__)
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert runner.sliced.idle()


@pytest.mark.parametrize("arch,scope,recompute", [("llama", "micro_batch", None), ("gpt", "sequence", None),
                                                 ("llama", "micro_batch", "full")])
def test_sliced_experts_equal_whole_sequences(arch, scope, recompute):
    """A MoE model (4 experts, top 2, a dense first block under the sequence scope) in
    uneven slices: the loss, every gradient (the routers' through the deferred balance
    loss) and the logged balance and z losses are the whole micro-batches'."""
    from parc.runtime.parallel.expert import moe

    config = dataclasses.replace(CONFIGS[arch], experts=4, top_k=2, aux_loss=0.1, z_loss=0.01, aux_loss_scope=scope,
                                 first_dense_layers=1 if scope == "sequence" else 0)
    T = config.seq_len
    lengths = (T // 2, T // 4, T - T // 2 - T // 4)
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, config.vocab, (B, T), generator=gen),
                torch.randint(0, config.vocab, (B, T), generator=gen)) for _ in range(MICRO)]
    reference = _build(arch, config=config)
    expected = sum(reference(x, y) / MICRO for x, y in batches)
    expected.backward()
    modes = None if recompute is None else [recompute] * config.layers
    net = _build(arch, modes, config=config)
    actions = build_schedule("terapipe", stages=1, micro_batches=MICRO, slices=len(lengths))[0]
    runner = PipelineExecutor([net], actions=actions, pp_group=None, pp_ranks=[0], pp_rank=0,
                              micro_batches=MICRO, activation_shape=(B, T, config.hidden),
                              device=torch.device("cpu"), slices=lengths)
    assert runner.step(batches.__getitem__) == pytest.approx(expected.item(), rel=1e-12)
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert any(p.grad.abs().sum() > 0 for name, p in net.named_parameters() if "router" in name)
    for got, want in zip(moe.moe_layers(net), moe.moe_layers(reference)):  # route scores in fp32: summed
        assert got.aux_sum == pytest.approx(want.aux_sum, rel=1e-6) and got.aux_sum > 0  # in another order
        assert got.z_sum == pytest.approx(want.z_sum, rel=1e-6) and got.z_sum > 0
        assert torch.equal(got.tokens, want.tokens)
    assert runner.sliced.idle()


def test_slice_lengths():
    assert slice_lengths(16, 4) == (4, 4, 4, 4)
    assert slice_lengths(16, [8, 5, 3]) == (8, 5, 3)
    with pytest.raises(ValueError, match="equal slices"):
        slice_lengths(16, 3)
    with pytest.raises(ValueError, match="sum to seq_len"):
        slice_lengths(16, [8, 4])
