"""B then W (runtime/parallel/pipeline/split_backward.py) gives exactly the gradients of one backward;
B touches no parameter's gradient, W fires the post-accumulate hooks dp relies on."""

import pytest
import torch

from parc.runtime.parallel.pipeline.split_backward import backward_input, backward_weight


class Block(torch.nn.Module):
    """A residual block with a parameter used twice and a norm: several joins per group."""

    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.scale = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return h * self.scale + x * self.scale


def reference(net, x, grad):
    x = x.detach().requires_grad_(True)
    torch.autograd.backward(net(x), grad)
    out = [p.grad.clone() for p in net.parameters()], x.grad.clone()
    net.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_b_then_w_is_one_backward(micro_batches):
    torch.manual_seed(0)
    net = torch.nn.Sequential(Block(), Block())
    xs = [torch.randn(4, 8) for _ in range(micro_batches)]
    grads = [torch.randn(4, 8) for _ in range(micro_batches)]
    expected_params = [torch.zeros_like(p) for p in net.parameters()]
    expected_inputs = []
    for x, g in zip(xs, grads):
        params, x_grad = reference(net, x, g)
        expected_params = [a + b for a, b in zip(expected_params, params)]
        expected_inputs.append(x_grad)
    fired = []
    for p in net.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    owed = []
    for x, g, want in zip(xs, grads, expected_inputs):  # every B first, then every W
        x = x.detach().requires_grad_(True)
        x_grad, debt = backward_input(net(x), g, x, net.parameters())
        torch.testing.assert_close(x_grad, want, rtol=0, atol=1e-6)
        owed.append(debt)
    assert fired == [] and all(p.grad is None for p in net.parameters())
    for debt in owed:
        backward_weight(debt)
    assert len(fired) == micro_batches * len(list(net.parameters()))
    for p, want in zip(net.parameters(), expected_params):
        torch.testing.assert_close(p.grad, want, rtol=0, atol=1e-6)


def test_first_stage_runs_the_whole_backward_in_w():
    torch.manual_seed(1)
    embed, block = torch.nn.Embedding(10, 8), Block()
    net = torch.nn.ModuleList([embed, block])
    tokens, grad = torch.randint(0, 10, (2, 4)), torch.randn(2, 4, 8)
    torch.autograd.backward(block(embed(tokens)), grad)
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    x_grad, debt = backward_input(block(embed(tokens)), grad, tokens, net.parameters())
    assert x_grad is None and all(p.grad is None for p in net.parameters())
    backward_weight(debt)
    for p, w in zip(net.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=0)


def test_loss_on_the_last_stage():
    torch.manual_seed(2)
    block = Block()
    x = torch.randn(3, 8)
    xr = x.clone().requires_grad_(True)
    block(xr).square().mean().backward()
    want_params, want_x = [p.grad.clone() for p in block.parameters()], xr.grad
    block.zero_grad(set_to_none=True)
    xs = x.clone().requires_grad_(True)
    x_grad, debt = backward_input(block(xs).square().mean(), None, xs, block.parameters())
    backward_weight(debt)
    torch.testing.assert_close(x_grad, want_x, rtol=0, atol=1e-7)
    for p, w in zip(block.parameters(), want_params):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-7)
