"""A zero-bubble build's deferred linears (split_backward.py, Note [deferred linear weights]):
B computes their input gradients only, W each weight's GEMM once, and B then W gives
bit for bit the gradients of one plain backward on a chunk of a llama; a middle chunk's B
is a bare autograd.grad (Note [bare B]), and so is the last's with an untied head; the
first (its linears plain), a tied head and a chunk with another parameter keep their paths."""

import pytest
import torch

from parc.runtime.models import model
from parc.runtime.parallel.pipeline.split_backward import (DeferredLinear, backward_input, backward_weight,
                                                           defer_linear_weights)

SHAPES = dict(arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=96, padded_vocab=128,
              seq_len=16, dropout=0.0, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)


def chunk(pp_rank, index, kernels="compiled", **changes):
    """Chunk ``index`` of ``pp_rank`` under ZB-V's placement (one layer each), with values."""
    config = model.ModelConfig(**{**SHAPES, **changes})
    net = model.build_stages(config, stages=((0, 1), (1, 2), (2, 3), (3, 4)), pp_rank=pp_rank, pp_size=2,
                             placement="v")
    net = model.init_weights(net, seed=3, device="cpu", init_on_device=True)
    return model.use_kernels(net, kernels, "cpu")[index]


def gemms(run) -> int:
    """How many aten::mm ``run`` calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return sum(event.name == "aten::mm" for event in prof.events())


@pytest.mark.parametrize("kernels", ["compiled", "eager"])
def test_b_then_w_is_one_plain_backward_bit_for_bit(kernels):
    plain, deferred = chunk(1, 0, kernels), defer_linear_weights([chunk(1, 0, kernels)])[0]
    linears = [m for m in deferred.modules() if isinstance(m, DeferredLinear)]
    assert len(linears) == 7  # q, k, v, o, gate, up, down
    torch.manual_seed(0)
    xs = [torch.randn(2, SHAPES["seq_len"], SHAPES["hidden"]) for _ in range(2)]
    grads = [torch.randn_like(x) for x in xs]
    want_inputs = []
    for x, g in zip(xs, grads):  # two micro-batches, accumulated
        x = x.clone().requires_grad_(True)
        torch.autograd.backward(plain(x), g)
        want_inputs.append(x.grad)
    fired = []
    for p in deferred.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    owed = []
    for x, g, want in zip(xs, grads, want_inputs):  # every B first, then every W
        x = x.clone().requires_grad_(True)
        y = deferred(x)
        assert gemms(lambda: owed.append(backward_input(y, g, x, deferred.parameters()))) == 7  # input grads
        torch.testing.assert_close(owed[-1][0], want, rtol=0, atol=0)
        assert owed[-1][1].groups == [] and len(owed[-1][1].kept) == 2  # Note [bare B]: the two norms' weights
    assert fired == [] and all(p.grad is None for p in deferred.parameters())
    for _, debt in owed:
        assert gemms(lambda: backward_weight(debt)) == 7  # each weight's GEMM once: none skipped, none twice
    assert len(fired) == 2 * len(list(deferred.parameters()))  # each parameter's hooks once a W
    for (name, p), q in zip(plain.named_parameters(), deferred.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


def test_first_stage():
    """The first stage's W runs its whole backward (token input), its linears plain: each
    weight's GEMM in that one backward, none deferred (Note [deferred linear weights])."""
    plain, deferred = chunk(0, 0), defer_linear_weights([chunk(0, 0)])[0]
    assert not any(isinstance(m, DeferredLinear) for m in deferred.modules())
    torch.manual_seed(1)
    x, grad = torch.randint(0, SHAPES["vocab"], (2, SHAPES["seq_len"])), torch.randn(2, SHAPES["seq_len"],
                                                                                     SHAPES["hidden"])
    torch.autograd.backward(plain(x), grad)
    x_grad, debt = backward_input(deferred(x), grad, x, deferred.parameters())
    assert x_grad is None and debt.groups is None  # W: the whole backward
    assert gemms(lambda: backward_weight(debt)) == 14  # each linear's two GEMMs once, as a plain backward
    for (name, p), q in zip(plain.named_parameters(), deferred.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("kernels,tied", [("compiled", False), ("eager", False), ("compiled", True)])
def test_last_stage(kernels, tied):
    """The last chunk's B starts from its loss. Untied, it is bare (Note [bare B]): the head's
    weight gradient comes from B beside the norms', reaches ``.grad`` in W, once a micro-batch
    (a W that dropped or doubled it would differ from a plain backward's); a tied copy of the
    embedding (Note [tied embeddings across stages]) keeps the join path."""
    plain, split = chunk(0, 1, kernels, tie_embeddings=tied), chunk(0, 1, kernels, tie_embeddings=tied)
    split = defer_linear_weights([split])[0]
    fired = []
    split.head.weight.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    torch.manual_seed(1)
    owed = []
    for _ in range(2):  # two micro-batches, every B first
        x = torch.randn(2, SHAPES["seq_len"], SHAPES["hidden"])
        targets = torch.randint(0, SHAPES["vocab"], (2, SHAPES["seq_len"]))
        xp = x.clone().requires_grad_(True)
        plain(xp, targets).backward()
        xs = x.clone().requires_grad_(True)
        x_grad, debt = backward_input(split(xs, targets), None, xs, split.parameters())
        torch.testing.assert_close(x_grad, xp.grad, rtol=0, atol=0)
        kept = [p for p, _ in debt.kept]
        if tied:
            assert debt.groups and not kept  # the join path
        else:
            assert debt.groups == [] and kept[-1] is split.head.weight and len(kept) == 4  # 3 norms and the head
        owed.append(debt)
    assert fired == [] and split.head.weight.grad is None
    for debt in owed:
        backward_weight(debt)
    assert len(fired) == 2
    for (name, p), q in zip(plain.named_parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


def test_a_backward_outside_b_and_biased_linears():
    """Outside a B a backward accumulates the deferred weights at once; a biased linear
    stays autograd's (the join path)."""
    torch.manual_seed(2)

    def net():
        return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.GELU(), torch.nn.Linear(16, 8),
                                   torch.nn.GELU())

    plain, deferred = net(), net()
    deferred.load_state_dict(plain.state_dict())
    defer_linear_weights([deferred])
    assert type(deferred[0]) is DeferredLinear and type(deferred[2]) is torch.nn.Linear
    x, grad = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    for _ in range(2):  # the second accumulates onto the first
        torch.autograd.backward(plain(x.clone().requires_grad_(True)), grad)
        torch.autograd.backward(deferred(x.clone().requires_grad_(True)), grad)
    for p, q in zip(plain.parameters(), deferred.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)


def test_zero3_chunks_keep_their_linears():
    """A chunk with ZeRO-3's split-backward hooks keeps autograd's linears (its gathers are the hooks')."""
    zero3, plain = (torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False)) for _ in range(2))
    zero3.split_backward_hooks = object()
    defer_linear_weights([zero3, plain])
    assert type(zero3[0]) is torch.nn.Linear and type(plain[0]) is DeferredLinear


def test_autocast_keeps_the_join_path():
    """Under autocast the cast nodes are autograd's: the linear runs as nn.Linear would, bit for bit."""
    torch.manual_seed(4)
    plain, deferred = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False)
    deferred.load_state_dict(plain.state_dict())
    defer_linear_weights([deferred])
    x, grad = torch.randn(2, 3, 8), torch.randn(2, 3, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_plain, y = plain(x.clone().requires_grad_(True)), deferred(x.clone().requires_grad_(True))
    assert y.grad_fn.name() == y_plain.grad_fn.name()  # no _DeferredBackward
    torch.autograd.backward(y_plain, grad)
    torch.autograd.backward(y, grad)
    torch.testing.assert_close(deferred.weight.grad, plain.weight.grad, rtol=0, atol=0)


def b_then_w(plain, split, runs=2):
    """``runs`` micro-batches through a plain backward and through B then W (every B first);
    asserts the gradients bit for bit; gives each B's path ("bare" or "join") and how many
    norm gradients it kept."""
    torch.manual_seed(5)
    xs = [torch.randn(2, SHAPES["seq_len"], SHAPES["hidden"]) for _ in range(runs)]
    grads = [torch.randn_like(x) for x in xs]
    owed = []
    for x, g in zip(xs, grads):
        torch.autograd.backward(plain(x.clone().requires_grad_(True)), g)
        x = x.clone().requires_grad_(True)
        x_grad, debt = backward_input(split(x), g, x, split.parameters())
        owed.append(debt)
    paths = [("bare" if debt.groups == [] else "join", len(debt.kept)) for debt in owed]
    for debt in owed:
        backward_weight(debt)
    for (name, p), q in zip(plain.named_parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)
    return paths


def test_bare_b_on_a_bias_free_gpt_and_its_fallbacks():
    """Note [bare B]: a middle gpt chunk whose linears lost their biases takes it (LayerNorm's
    weight and bias from B); with the biases it keeps the join path; so does a llama chunk
    whose linear once ran under autocast, and one with a tensor hook on a norm's weight."""
    def bias_free(net):
        for module in net.modules():
            if type(module) is torch.nn.Linear:
                module.bias = None
        return net

    plain, split = (bias_free(chunk(1, 0, arch="gpt", kv_heads=4)) for _ in range(2))
    split.load_state_dict(plain.state_dict())
    assert b_then_w(plain, defer_linear_weights([split])[0]) == [("bare", 4)] * 2  # two LayerNorms: weight, bias
    plain, split = chunk(1, 0, arch="gpt", kv_heads=4), defer_linear_weights([chunk(1, 0, arch="gpt", kv_heads=4)])[0]
    assert b_then_w(plain, split) == [("join", 0)] * 2  # biased linears
    plain, split = chunk(1, 0), defer_linear_weights([chunk(1, 0)])[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        split(torch.randn(2, SHAPES["seq_len"], SHAPES["hidden"], requires_grad=True))  # marks its weights "joined"
    assert b_then_w(plain, split) == [("join", 0)] * 2
    plain, split = chunk(1, 0), defer_linear_weights([chunk(1, 0)])[0]
    hooked = [p for name, p in split.named_parameters() if name.endswith("norm.weight")][0]
    seen = []
    hooked.register_hook(lambda grad: seen.append(grad))
    assert b_then_w(plain, split) == [("join", 0)] * 2
    assert len(seen) == 2  # once a micro-batch


def test_bare_b_hands_each_norm_gradient_to_w_once():
    """The norms' weight gradients come from B, reach ``.grad`` only in W, once each: a
    W that dropped or doubled them would differ from a plain backward's."""
    plain, split = chunk(1, 0), defer_linear_weights([chunk(1, 0)])[0]
    norms = [p for name, p in split.named_parameters() if "norm" in name]
    fired = []
    for p in norms:
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    torch.manual_seed(6)
    x, g = torch.randn(2, SHAPES["seq_len"], SHAPES["hidden"], requires_grad=True), torch.randn(2, SHAPES["seq_len"],
                                                                                               SHAPES["hidden"])
    torch.autograd.backward(plain(x.detach().clone().requires_grad_(True)), g)
    _, debt = backward_input(split(x), g, x, split.parameters())
    assert [p for p, _ in debt.kept] == norms and fired == [] and all(p.grad is None for p in norms)
    backward_weight(debt)
    assert len(fired) == len(norms)
    want = dict(plain.named_parameters())
    for name, p in split.named_parameters():
        torch.testing.assert_close(p.grad, want[name].grad, rtol=0, atol=0, msg=name)


def test_bare_b_under_recompute():
    """A checkpointed chunk (recompute = full) recomputes its forward inside the bare B, bit for bit."""
    class Recomputed(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.net, x, use_reentrant=False)

    plain, split = chunk(1, 0), defer_linear_weights([chunk(1, 0)])[0]
    assert b_then_w(Recomputed(plain), Recomputed(split)) == [("bare", 2)] * 2
