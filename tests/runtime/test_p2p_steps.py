"""Pre-posted receives (runtime/parallel/pipeline/p2p.py): the executor's steps keep every wait where the
schedule put its receive, post each receive at most ``lookahead`` computes earlier, and
carry every message exactly once."""

import pytest

import torch

from parc.runtime.parallel.pipeline.p2p import lookahead, p2p_steps
from parc.runtime.parallel.pipeline.pipeline import PipelineExecutor
from parc.runtime.schedules.schedule import COMPUTE, RECVS, SENDS, Op, build_schedule, describe

CASES = [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zero_bubble", 4, 8, 1),
         ("zero_bubble_v", 4, 8, 2),
         ("1f1b", 2, 1, 1)]


LOOKAHEAD = 1  # the default depth; test_receives_posted_lookahead_computes_ahead tries others


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", CASES)
def test_steps_keep_waits_and_post_early(kind, stages, micro_batches, chunks):
    for actions in build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks):
        steps = p2p_steps(actions, LOOKAHEAD)
        computes = [a for a in actions if a.op in COMPUTE]
        assert [s.compute for s in steps] == computes + [None]
        posted = [a for s in steps for a in s.post]
        assert sorted(map(describe, posted)) == sorted(describe(a) for a in actions if a.op not in COMPUTE)
        posted_at = {a: i for i, s in enumerate(steps) for a in s.post}
        for index, step in enumerate(steps):
            # the receives waited here are exactly those the list put right before this compute
            before = []
            position = actions.index(step.compute) if step.compute else len(actions)
            for a in reversed(actions[:position]):
                if a.op in RECVS:
                    before.append(a)
                elif a.op in COMPUTE:
                    break
            assert sorted(map(describe, step.wait)) == sorted(map(describe, before))
            for receive in step.wait:
                assert index - LOOKAHEAD <= posted_at[receive] <= index
                if index > LOOKAHEAD:
                    assert posted_at[receive] == index - LOOKAHEAD  # as early as allowed
            # a send goes out in the step right after the compute that produced it
            for send in (a for a in step.post if a.op in SENDS):
                producer = next(a for a in reversed(actions[:actions.index(send)]) if a.op in COMPUTE)
                assert steps[index - 1].compute == producer


@pytest.mark.parametrize("lookahead", [1, 2, 3, 5])
@pytest.mark.parametrize("kind,stages,micro_batches,chunks", CASES)
def test_receives_posted_lookahead_computes_ahead(kind, stages, micro_batches, chunks, lookahead):
    """Each receive is posted exactly ``lookahead`` computes before the one that waits
    on it (all of the first computes' at the first step), and the buffers outstanding
    at any step are those of at most ``lookahead + 1`` computes (the Note's bound)."""
    for actions in build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks):
        steps = p2p_steps(actions, lookahead)
        posted_at = {a: i for i, s in enumerate(steps) for a in s.post if a.op in RECVS}
        waited_at = {a: i for i, s in enumerate(steps) for a in s.wait}
        assert posted_at.keys() == waited_at.keys()
        for receive, index in waited_at.items():
            assert posted_at[receive] == max(0, index - lookahead)
        for index in range(len(steps)):
            open_computes = {waited_at[r] for r, at in posted_at.items() if at <= index <= waited_at[r]}
            assert len(open_computes) <= lookahead + 1


@pytest.mark.parametrize("device,depth", [("cpu", 3), ("cuda", 1)])
def test_the_executor_posts_three_computes_ahead_on_cpu(device, depth):
    """Note [pre-posted receives]: 3 on CPU (gloo's handshake needs more than one short
    compute on shared cores), 1 on CUDA (an nccl batch holds the stream until its
    receives arrive); the executor builds its steps at that depth."""
    assert lookahead(device) == depth
    actions = build_schedule("interleaved", stages=2, micro_batches=4, chunks=2)[0]
    runner = PipelineExecutor([torch.nn.Identity(), torch.nn.Identity()], actions=actions, pp_group=None,
                              pp_ranks=[0, 1], pp_rank=0, micro_batches=4, activation_shape=(1, 4, 8),
                              device=torch.device(device))
    assert runner.steps == p2p_steps(actions, depth)
    assert p2p_steps(actions, 3) != p2p_steps(actions, 1)


class _Chunk(torch.nn.Module):
    """A stage whose forward reads its tokens and (last stage) targets: a scalar loss."""

    def __init__(self, documents=None):
        super().__init__()
        self.w, self.documents = torch.nn.Parameter(torch.ones(())), documents

    def forward(self, x, targets):
        return (x.float().mean() + (0.0 if targets is None else targets.float().mean())) * self.w


def _executor(chunks, actions, stages, rank, micro_batches, **kwargs):
    return PipelineExecutor(chunks, actions=actions, pp_group=None, pp_ranks=list(range(stages)), pp_rank=rank,
                            micro_batches=micro_batches, activation_shape=(1, 4, 8), device=torch.device("cpu"),
                            **kwargs)


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", CASES)
def test_a_rank_reads_the_data_of_its_first_and_last_stages(kind, stages, micro_batches, chunks):
    """Note [data when needed]: a rank holding the first or the last virtual stage reads
    every micro-batch, in the order of its first forward of each; a middle stage reads
    none, unless its blocks see the documents."""
    placement = {"zero_bubble_v": "v"}.get(kind, "interleaved")
    for rank, actions in enumerate(build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks)):
        plain = _executor([torch.nn.Identity()] * chunks, actions, stages, rank, micro_batches, placement=placement)
        firsts = [a.micro for a in actions if a.op is Op.FORWARD]
        ends = {0, stages * chunks - 1}
        holds_an_end = any(plain._vstage(c) in ends for c in range(chunks))
        order = [a.micro for a in actions if a.op is Op.FORWARD and plain._vstage(a.chunk) in ends]
        assert plain.reads == (tuple(dict.fromkeys(order)) if holds_an_end else ())
        assert sorted(plain.reads) == (list(range(micro_batches)) if holds_an_end else [])
        documents = _executor([_Chunk(documents=object())] * chunks, actions, stages, rank, micro_batches,
                              placement=placement)
        assert documents.reads == tuple(dict.fromkeys(firsts))


def test_each_micro_batch_is_made_once_when_first_read():
    """The step calls ``batch(m)`` once per micro-batch, when its first forward reads it."""
    micro_batches, made = 4, []
    runner = _executor([_Chunk()], build_schedule("1f1b", stages=1, micro_batches=micro_batches)[0], 1, 0,
                       micro_batches)

    def batch(m):
        made.append(m)
        return torch.full((1, 4), m), torch.full((1, 4), 2 * m)

    loss = runner.step(batch)
    assert made == [0, 1, 2, 3]
    assert loss == pytest.approx(sum(3 * m for m in range(micro_batches)) / micro_batches)


def test_a_middle_stage_makes_no_data():
    """Note [data when needed]: a middle stage's forward runs on the received activation
    and never asks for its micro-batch (a first or last stage's does)."""
    from parc.runtime.parallel.pipeline.pipeline import _ACT, _Made

    class Middle(torch.nn.Module):
        def forward(self, x, targets):
            assert targets is None
            return x * 2

    made = []
    for rank, chunk, expected in ((1, Middle(), []), (0, _Chunk(), [0])):
        actions = build_schedule("1f1b", stages=3, micro_batches=2)[rank]
        forward = next(a for a in actions if a.op is Op.FORWARD)
        runner = _executor([chunk], actions, 3, rank, 2)
        batches = _Made(lambda m: made.append(m) or (torch.zeros(1, 4, dtype=torch.long),) * 2)
        received = {(_ACT, forward.micro, 0): (None, torch.ones(1, 4, 8))}
        runner._compute(forward, batches, {}, {}, received, {}, {})
        assert made == expected
