"""Device presets: what ``mesh.device = NAME`` implies when a key is not given.

Takes: nothing (leaf module). Gives: ``PRESETS`` (device name → ``Preset``). Figures
are the dense bf16/fp16 peaks and memory of /work/shared/reference/README.md
(memory in decimal GB as listed there: 80 GB = 80e9 bytes, the conservative reading).
``intra_node`` is per direction: NVLink's listed bidirectional total halved (A100
600 GB/s → 300 GB/s; H100/H200 900 → 450 GB/s); rtx3090 has PCIe 4.0 x16, 32 GB/s.
``inter_node`` is per device, per direction: one HDR InfiniBand port (200 Gb/s =
25 GB/s) per A100, one NDR port (400 Gb/s = 50 GB/s) per H100/H200, 100 Gb/s
(12.5 GB/s) for rtx3090 servers. ``cpu`` has no memory or FLOP figure (measure it
with ``parc profile``); its links are an assumption: 10 GB/s between ranks of one
machine (shared memory), 1.25 GB/s (10 Gb/s Ethernet) between machines.

Used by ``dsl/build_spec.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    memory: float | None
    """Bytes per device."""
    flops: float | None
    """Dense peak FLOP/s per device (bf16/fp16)."""
    intra_node: float
    """Bytes/s between devices of a node, per direction."""
    inter_node: float
    """Bytes/s between nodes, per device, per direction."""


GB = 1e9
PRESETS: dict[str, Preset] = {
    "a100-40gb": Preset(memory=40 * GB, flops=312e12, intra_node=300 * GB, inter_node=25 * GB),
    "a100-80gb": Preset(memory=80 * GB, flops=312e12, intra_node=300 * GB, inter_node=25 * GB),
    "h100-80gb": Preset(memory=80 * GB, flops=989e12, intra_node=450 * GB, inter_node=50 * GB),
    "h200": Preset(memory=141 * GB, flops=989e12, intra_node=450 * GB, inter_node=50 * GB),
    "rtx3090": Preset(memory=24 * GB, flops=71e12, intra_node=32 * GB, inter_node=12.5 * GB),
    "cpu": Preset(memory=None, flops=None, intra_node=10 * GB, inter_node=1.25 * GB),
}
