"""Pre-posted, batched point-to-point messages for the pipeline executor.

Takes: a rank's action list (``schedule.build_schedule``). Gives: ``p2p_steps``, the
list as steps (the batch of messages to post, the receives to wait for, one compute),
and ``post_batch``/``Posted``, which post a step's messages with one
``dist.batch_isend_irecv`` and wait for one of them. Before: ``schedule``. After:
``pipeline.PipelineExecutor`` runs the steps.

Note [pre-posted receives]: the lists place each receive right before the compute
that needs it and each send right after the compute that produced it (schedule.py,
Note [the execution model]). The executor keeps the *waits* exactly there, so the
lists stay deadlock-free under the same model, but *posts* each receive a few
computes earlier (``lookahead``: 3 on CPU, 1 on CUDA), in one batch with the sends of the compute just finished (as
Megatron's ``batch_isend_irecv`` per step): the transfer lands while this rank still
computes, and only the part of it not yet done when the compute that needs it comes
is waited on, which is all ``exposed_comm_s`` counts. Buffers are allocated when
posted: at most depth + 1 computes' receives are outstanding (one boundary
tensor each: a few activations' worth beside the micro-batches in flight). Messages
are matched by tag, not by order, so posting early cannot mismatch them.

Why 3 computes and not 1: gloo moves a message only once both ends have posted it
(a rendezvous between the two processes' I/O threads), so a receive posted during
the compute before it leaves that one compute for the handshake and the copy. On
shared cores each thread's wake-up can take a scheduler slice, and a compute of a
few milliseconds is often too short: bench/pipe_trace.py's replay of the lists with
the measured computes counts what the waits add (bench/peer_notes.md, 2026-12-06
pipe). Interleaved 1F1B, whose three stage boundaries all cross ranks, lost a median
63 ms a step to its messages with receives posted 1 compute ahead and 14 ms with 3
(9 alternating pairs, load 4-6; 8 ahead was no better than 3); ZB-V 63 and 53 ms;
1F1B, whose messages are each needed as soon as they are made, no difference. On an idle machine the handshake
takes microseconds and the depth does not matter. On CUDA the depth stays 1: nccl
runs a batch as one kernel on the stream the two ranks' point-to-point messages
share, which completes only when its receives have arrived, so a receive posted
three computes early would hold the sends of the batches behind it (Megatron posts
one compute ahead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...schedules.schedule import RECVS, SENDS, Action

LOOKAHEAD = {"cpu": 3}
"""How many computes ahead a receive is posted, by device type (1: during the compute
before it, the depth of any device not named)."""


def lookahead(device) -> int:
    """The depth of Note [pre-posted receives] for the executor's ``device``."""
    return LOOKAHEAD.get(torch.device(device).type, 1)


@dataclass(frozen=True, slots=True)
class Step:
    post: tuple[Action, ...]
    """Sends of the previous compute, then the receives posted for a later one: one batch."""
    wait: tuple[Action, ...]
    """The receives ``compute`` needs (posted at this step or before)."""
    compute: Action | None
    """F, B or W; None for the closing step that only sends."""


def p2p_steps(actions, lookahead: int = 1) -> tuple[Step, ...]:
    """The actions as steps, each receive posted ``lookahead`` computes before its wait
    (Note [pre-posted receives]); every message appears once."""
    computes: list[Action] = []
    needs: list[list[Action]] = []  # per compute, the receives listed before it
    produces: list[list[Action]] = [[]]  # per compute + 1, the sends listed after it
    waiting: list[Action] = []
    for action in actions:
        if action.op in RECVS:
            waiting.append(action)
        elif action.op in SENDS:
            produces[-1].append(action)
        else:
            computes.append(action)
            needs.append(waiting)
            produces.append([])
            waiting = []
    if waiting:
        raise ValueError(f"receives after the last compute: {waiting}")
    steps = []
    for index, compute in enumerate(computes):
        first = 0 if index == 0 else index + lookahead  # at the first step: everything up to the lookahead
        early = [r for j in range(first, min(index + lookahead, len(computes) - 1) + 1) for r in needs[j]]
        steps.append(Step(post=tuple(produces[index]) + tuple(early), wait=tuple(needs[index]), compute=compute))
    steps.append(Step(post=tuple(produces[len(computes)]), wait=(), compute=None))
    return tuple(steps)


class Posted:
    """The works of one batch: per message, or one for the batch when the backend
    coalesces (nccl); waiting on a message then waits on its whole batch."""

    __slots__ = ("works", "index")

    def __init__(self, works, index: int | None):
        self.works, self.index = works, index

    def wait(self) -> None:
        for work in self.works if self.index is None else (self.works[self.index],):
            work.wait()


def post_batch(messages, group) -> list[Posted]:
    """Post ``messages`` — (is_send, tensor, global peer rank, tag) — as one batch; a
    ``Posted`` per message."""
    if not messages:
        return []
    ops = [dist.P2POp(dist.isend if is_send else dist.irecv, tensor, peer, group=group, tag=tag)
           for is_send, tensor, peer, tag in messages]
    works = dist.batch_isend_irecv(ops)
    each = len(works) == len(ops)
    return [Posted(works, i if each else None) for i in range(len(ops))]
