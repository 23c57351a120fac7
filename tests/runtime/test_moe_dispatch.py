"""The MoE dispatch bookkeeping (runtime/parallel/expert/routing.py, Note [dispatch without masks] in moe.py).

Each sort-based order against the masks and loops it replaced, written plainly here:
the orders must be the same index for index, so the numbers stay bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from parc.runtime.parallel.expert import routing


@pytest.mark.parametrize("drop", [0.0, 0.3, 1.0])
def test_kept_slots_by_expert_are_the_masks_order(drop):
    g = torch.Generator().manual_seed(3)
    slot_expert = torch.randint(0, 6, (40,), generator=g)
    kept = torch.rand(40, generator=g) >= drop
    keep = kept.nonzero().squeeze(1)
    reference = keep[torch.sort(slot_expert[keep], stable=True).indices]
    order, counts = routing.by_expert(slot_expert, kept.view(20, 2), 6)
    assert torch.equal(order, reference)
    assert torch.equal(counts, torch.bincount(slot_expert[reference], minlength=6))
    if drop == 0.0:  # dropless: no mask at all, the same order
        order, counts = routing.by_expert(slot_expert, None, 6)
        assert torch.equal(order, reference)
        assert torch.equal(counts, torch.bincount(slot_expert, minlength=6))


def test_groups_keep_the_order_within_each_part():
    g = torch.Generator().manual_seed(4)
    order = torch.randperm(30, generator=g)
    part = torch.randint(0, 3, (30,), generator=g)
    parts = routing.grouped(order, part, 4)  # part 3 is empty
    assert [p.tolist() for p in parts] == [order[part == i].tolist() for i in range(4)]


def test_expert_major_is_the_by_expert_then_source_order():
    sizes = torch.tensor([[2, 0, 3], [1, 4, 0]])
    regroup, back = routing.expert_major(sizes)
    starts = (torch.cumsum(sizes.reshape(-1), 0) - sizes.reshape(-1)).view(2, 3)
    reference = [r for e in range(3) for i in range(2) for r in range(starts[i, e], starts[i, e] + sizes[i, e])]
    assert regroup.tolist() == reference
    assert torch.equal(regroup[back], torch.arange(regroup.numel()))
    empty, _ = routing.expert_major(torch.zeros(2, 3, dtype=torch.int64))
    assert empty.numel() == 0


def test_a_permutations_gradient_is_the_inverse_gather():
    x = torch.randn(5, 3, requires_grad=True)
    perm = torch.tensor([3, 0, 4, 1, 2])
    y = routing.permuted(x, perm, routing.inverse(perm))
    weight = torch.randn(5, 3)
    (y * weight).sum().backward()
    reference = torch.zeros(5, 3).index_put_((perm,), weight, accumulate=True)
    assert torch.equal(y, x.detach()[perm])
    assert torch.equal(x.grad, reference)
