"""The pipeline's messages between ranks of one host, through shared memory.

Takes: the pipeline group, its ranks, this rank's peers and the largest message and tag
count of its action list. Gives: ``Mailbox.post``, with ``p2p.post_batch``'s contract (a
handle per message, whose ``wait`` returns once the message is in its tensor), which the
executor uses instead of gloo when ``mailbox_for`` finds every pipeline rank on this host
and the device is the CPU. Before: ``p2p.p2p_steps``. After: ``pipeline.PipelineExecutor``.

Note [pipeline messages through shared memory]: through gloo, a message between two
processes of one host crosses four threads: the sender's main thread hands it to its
gloo I/O thread, which writes it to a TCP socket, which the receiver's I/O thread reads
and then wakes the receiver's main thread. On a CPU host whose cores the ranks' computes
keep busy, each hand-over waits for a scheduler slice: bench/pipe_trace.py measured the
interleaved 1F1B step at bench/peer.py's shapes losing 10.1 ms to its messages (span
against a replay with free messages) where 1F1B, with a third of the boundary crossings,
lost 3.3, and its gloo threads took 7 ms of CPU a rank a step against 2.5
(bench/peer_notes.md, 2026-12-06 session 8). Here the sender copies the tensor into a
slot of a shared file (its ``tag``'s) and writes the slot's number, 8 bytes, to a FIFO;
the receiver, when it waits, reads the numbers that arrived and copies its slot out. No
other thread takes part, and a receiver blocked in ``read`` is woken by the write itself.
The write and the read order the copies (the kernel's pipe locks).

Slots: each directed pair of neighbouring ranks has one file of ``2 × tags`` slots, each
as large as the largest message, a step using the half of its parity. Tags are unique
within a step (pipeline.py's ``_tag``), and a rank cannot start writing step s + 2 before
its peer has finished step s: every message it sends in step s + 1 is answered, in that
step, by one from the peer (an activation by its gradient, and a gradient answers the
activation it follows), so the peer is in step s + 1 by then. Files and FIFOs are
unlinked once both ends hold them, so a run that ends after its set-up leaves nothing in
/dev/shm (one killed inside the set-up can leave its files, named ``parc-pp-*``). Used
where every pipeline rank reports the same host (hostname and boot id), one pair's file
fits ``PAIR_BYTES`` and all of them half of what /dev/shm has free (a container's is
often 64 MiB: a write past it would kill the process); else, or with
``PARC_PIPELINE_SHM=0``, gloo as before (every rank decides alike: the facts are
gathered). A receive waits at most ``TIMEOUT_S``, gloo's default, then raises.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import uuid

import torch
import torch.distributed as dist

PAIR_BYTES = 256 << 20
"""The largest shared file of one directed pair of ranks (2 × tags slots of the largest message)."""

TIMEOUT_S = 1800.0
"""How long a receive waits before it raises (gloo's default timeout)."""

_RECORD = struct.Struct("<q")


def mailbox_for(group, ranks, me: int, peers, *, numel: int, tags: int, device) -> Mailbox | None:
    """A ``Mailbox`` for this rank of the pipeline ``group`` (``ranks``: global ranks by
    pipeline index, ``me`` this rank's index, ``peers`` the pipeline indices it exchanges
    messages with), or None where gloo carries the messages (Note [pipeline messages through
    shared memory]). Collective over ``group`` on the CPU: every pipeline rank calls it."""
    if torch.device(device).type != "cpu" or group is None:
        return None
    pair = 2 * tags * numel * 4
    wanted = os.environ.get("PARC_PIPELINE_SHM", "1") != "0" and pair <= PAIR_BYTES
    facts = [None] * len(ranks)
    dist.all_gather_object(facts, (wanted, _host(), _shm_free(), len(set(peers)) * pair), group=group)
    wanted, hosts, free, needs = zip(*facts)
    if not all(wanted) or None in hosts or len(set(hosts)) > 1:
        return None
    if 2 * sum(needs) > min(free):  # a small /dev/shm (a container's): gloo
        return None
    return Mailbox(group, ranks, me, peers, numel=numel, tags=tags)


def _host():
    """This host's identity (hostname, boot id), or None where Linux does not say it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return socket.gethostname(), f.read().strip()
    except OSError:
        return None


def _shm_free() -> int:
    """The bytes free in /dev/shm (0 without it)."""
    try:
        free = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return free.f_bavail * free.f_frsize


class Mailbox:
    """Shared slots and a FIFO per directed pair of neighbouring pipeline ranks."""

    def __init__(self, group, ranks, me: int, peers, *, numel: int, tags: int):
        self.tags, self.parity = tags, 0
        self.index = {rank: i for i, rank in enumerate(ranks)}  # global rank -> pipeline index
        token = [uuid.uuid4().hex if me == 0 else None]
        dist.broadcast_object_list(token, src=ranks[0], group=group)
        base = f"/dev/shm/parc-pp-{token[0]}"
        peers = sorted(set(peers))
        size = 2 * tags * numel

        def paths(src, dst):
            return f"{base}-{src}-{dst}", f"{base}-{src}-{dst}.fifo"

        made = []
        for src in peers:  # this rank's incoming files: the receiver makes them
            data, fifo = paths(src, me)
            with open(data, "wb") as f:
                f.truncate(size * 4)
            os.mkfifo(fifo, 0o600)
            made += [data, fifo]
        dist.barrier(group=group)
        self.inbox, self.outbox, self.arrived = {}, {}, {}
        for peer in peers:
            for box, (data, fifo) in ((self.inbox, paths(peer, me)), (self.outbox, paths(me, peer))):
                box[peer] = (torch.from_file(data, shared=True, size=size, dtype=torch.float32).view(2 * tags, numel),
                             os.open(fifo, os.O_RDWR))  # read-write: the open never waits for the other end
            self.arrived[peer] = set()
        dist.barrier(group=group)
        for path in made:
            os.unlink(path)

    def next_step(self) -> None:
        """The executor's step starts: its messages take the other half of the slots."""
        self.parity ^= 1

    def post(self, messages) -> list:
        """``p2p.post_batch``'s contract: (is_send, tensor, global peer rank, tag) each; a
        send is copied now, a receive when waited on."""
        handles = []
        for is_send, tensor, peer, tag in messages:
            peer, slot = self.index[peer], self.parity * self.tags + tag
            if is_send:
                data, fd = self.outbox[peer]
                data[slot, : tensor.numel()].copy_(tensor.reshape(-1))
                os.write(fd, _RECORD.pack(slot))
                handles.append(_SENT)
            else:
                handles.append(_Receive(self, peer, slot, tensor))
        return handles

    def receive(self, peer: int, slot: int, tensor) -> None:
        """Wait for ``slot`` from ``peer``, then copy it into ``tensor``."""
        data, fd = self.inbox[peer]
        arrived = self.arrived[peer]
        while slot not in arrived:
            ready, _, _ = select.select([fd], [], [], TIMEOUT_S)
            if not ready:
                raise RuntimeError(f"pipeline message from pipeline rank {peer} not received in {TIMEOUT_S:.0f} s")
            chunk = os.read(fd, 4096)  # whole 8-byte records: each write is one, atomic
            arrived.update(_RECORD.unpack_from(chunk, at)[0] for at in range(0, len(chunk), _RECORD.size))
        arrived.remove(slot)
        tensor.view(-1).copy_(data[slot, : tensor.numel()])


class _Receive:
    __slots__ = ("mailbox", "peer", "slot", "tensor")

    def __init__(self, mailbox, peer, slot, tensor):
        self.mailbox, self.peer, self.slot, self.tensor = mailbox, peer, slot, tensor

    def wait(self) -> None:
        if self.mailbox is not None:
            self.mailbox.receive(self.peer, self.slot, self.tensor)
            self.mailbox = None


class _Sent:
    __slots__ = ()

    def wait(self) -> None:  # copied at the post
        return None


_SENT = _Sent()
