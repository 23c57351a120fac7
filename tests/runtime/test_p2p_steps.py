"""Pre-posted receives (runtime/parallel/pipeline/p2p.py): the executor's steps keep every wait where the
schedule put its receive, post each receive at most LOOKAHEAD computes earlier, and
carry every message exactly once."""

import pytest

from parc.runtime.parallel.pipeline.p2p import LOOKAHEAD, p2p_steps
from parc.runtime.schedules.schedule import COMPUTE, RECVS, SENDS, build_schedule, describe

CASES = [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zero_bubble", 4, 8, 1),
         ("zero_bubble_v", 4, 8, 2),
         ("1f1b", 2, 1, 1)]


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", CASES)
def test_steps_keep_waits_and_post_early(kind, stages, micro_batches, chunks):
    for actions in build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks):
        steps = p2p_steps(actions)
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
