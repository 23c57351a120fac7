"""kernels.dispatch.call (Note [custom-op dispatch]): the direct path gives the custom op's
numbers bit for bit, forward and backward, and the op itself runs under fake tensors."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from parc.runtime import kernels

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
