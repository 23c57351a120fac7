"""kernels.dispatch.call (Note [custom-op dispatch]): the direct path gives the custom op's
numbers bit for bit, forward and backward, and the op itself runs under fake tensors."""

import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from parc.runtime import kernels
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # built.py
import built  # noqa: E402

ops = kernels.select("compiled", "cpu")
pytestmark = pytest.mark.skipif(ops is None, reason="no compiled CPU kernels here")


def _grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return [out.detach()] + [t.grad for t in inputs]


CASES = {
    "layer_norm": (lambda x, w, b: ops.layer_norm_fwd(x, w, b, 1e-5), lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), 3),
    "rms_norm": (lambda x, w: ops.rms_norm_fwd(x, w, 1e-5), lambda x, w: ops.rms_norm(x, w, 1e-5), 2),
    "swiglu": (lambda g, u: ops._swiglu(g, u), lambda g, u: ops.swiglu(g, u), 2),
}


@pytest.mark.parametrize("name", CASES)
def test_direct_path_matches_the_custom_op_bitwise(name):
    as_op, direct, count = CASES[name]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(6, 16, generator=gen)] + [torch.randn(16, generator=gen) + 1 for _ in range(count - 1)]
    if name == "swiglu":
        inputs = [torch.randn(6, 16, generator=gen) for _ in range(2)]
    for a, b in zip(_grads(as_op, *inputs), _grads(direct, *inputs)):
        assert torch.equal(a, b)


def test_fake_tensors_take_the_custom_op():
    with FakeTensorMode():
        x, w = torch.empty(4, 8), torch.empty(8)
        y = ops.rms_norm(x, w, 1e-5)
    assert y.shape == (4, 8)


def _kinds_taken(config, thresholds, monkeypatch):
    """A model built (use_kernels included) with ``thresholds`` as kernel_sizes.EAGER_BELOW."""
    from parc.runtime.layout import kernel_sizes
    from parc.runtime.models import model

    monkeypatch.delenv("PARC_KERNELS_EAGER_BELOW", raising=False)
    monkeypatch.setattr(kernel_sizes, "EAGER_BELOW", thresholds)
    net = built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=1, device="cpu")
    return net


def test_each_kind_of_op_takes_its_own_threshold(monkeypatch):
    """Note [eager at small shapes]: LayerNorm and RMSNorm, their residual forms, SwiGLU and
    GeLU decide apart, each from the model's global size (seq_len × hidden, × ffn)."""
    from parc.runtime.models import model

    seq, hidden, ffn = 8, 32, 64
    for arch in ("gpt", "llama"):
        config = model.ModelConfig(arch=arch, layers=1, hidden=hidden, heads=4, kv_heads=4, ffn=ffn, vocab=64,
                                   padded_vocab=64, seq_len=seq)
        norm, act = ("rms_norm", "swiglu") if arch == "llama" else ("layer_norm", "bias_gelu")
        # each kind pays exactly at its size: the plain norm and the activation, not the add + norm
        thresholds = {kind: 1 << 30 for kind in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
                                                 "swiglu", "bias_gelu", "rotary")}
        thresholds.update({norm: seq * hidden, act: seq * ffn})
        net = _kinds_taken(config, thresholds, monkeypatch)
        norms = [m for m in net.modules() if isinstance(m, model.Norm)]
        assert norms and all(m.fused is ops and m.fused_add is None for m in norms)
        assert all(m.fused is ops for m in net.modules() if isinstance(m, model.MLP))
        assert all(m.fused is None for m in net.modules() if isinstance(m, model.Attention))
        thresholds.update({norm: seq * hidden + 1, act: seq * ffn + 1, f"add_{norm}": 0})
        net = _kinds_taken(config, thresholds, monkeypatch)
        assert all(m.fused is None and m.fused_add is ops for m in net.modules() if isinstance(m, model.Norm))
        assert all(m.fused is None for m in net.modules() if isinstance(m, model.MLP))


def test_shared_experts_decide_by_their_own_width(monkeypatch):
    """The shared experts' MLP is shared_experts · expert_ffn wide, not ffn."""
    from parc.runtime.models import model

    config = model.ModelConfig(arch="llama", layers=1, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=64,
                               padded_vocab=64, seq_len=8, experts=4, top_k=2, expert_ffn=16, shared_experts=2)
    thresholds = dict.fromkeys(("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "bias_gelu", "rotary"), 0)
    for below, pays in ((8 * 2 * 16, True), (8 * 2 * 16 + 1, False)):  # seq · shared_experts · expert_ffn
        net = _kinds_taken(config, {**thresholds, "swiglu": below}, monkeypatch)
        (shared,) = [m for m in net.modules() if isinstance(m, model.MLP)]
        assert shared.width == 32 and (shared.fused is ops) == pays


def test_the_planner_reads_the_kinds_the_model_takes(monkeypatch):
    """runtime/layout/kernel_sizes.py: ``kinds_that_pay`` names exactly the kinds ``use_kernels``
    gave the norms, the dense MLP and rotary, and the saved-tensor model follows it (an
    eager SwiGLU saves silu too: 4 per ffn element, not 3)."""
    from parc.runtime.layout import kernel_sizes
    from parc.runtime.models import model
    from parc.runtime.layout.model_desc import describe
    from parc.runtime.layout.saved_elements import block_saved_elements

    config = model.ModelConfig(arch="llama", layers=1, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=64,
                               padded_vocab=64, seq_len=8)
    for swiglu_below in (0, 8 * 64 + 1):
        thresholds = {kind: 0 for kind in kernel_sizes.EAGER_BELOW} | {"swiglu": swiglu_below}
        net = _kinds_taken(config, thresholds, monkeypatch)
        kinds = kernel_sizes.kinds_that_pay(config, cpu=True)
        (mlp,) = [m for m in net.modules() if isinstance(m, model.MLP)]
        norms = [m for m in net.modules() if isinstance(m, model.Norm)]
        (attention,) = [m for m in net.modules() if isinstance(m, model.Attention)]
        assert ("swiglu" in kinds) == (mlp.fused is ops) == (swiglu_below == 0)
        assert "rms_norm" in kinds and all(m.fused is ops for m in norms) and attention.fused is ops
        desc = describe(config)
        every = block_saved_elements(config, desc.blocks[0], tp=1, sp=False, recompute="none", micro_batch=1)
        chosen = block_saved_elements(config, desc.blocks[0], tp=1, sp=False, recompute="none", micro_batch=1,
                                      compiled=kinds)
        assert chosen - every == (0 if swiglu_below == 0 else config.ffn)
