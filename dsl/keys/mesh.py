"""The ``mesh`` block's keys: the hardware."""

from __future__ import annotations

from .. import units
from .types import BlockDef, DEVICES, Param, _int

MESH = BlockDef(
    name="mesh",
    doc="the hardware",
    keys=(
        _int("nodes", "machines", required=True),
        _int("devices_per_node", "accelerators (or CPU ranks) per machine", required=True),
        Param(name="device", type="enum", choices=DEVICES, required=True, doc="device preset"),
        Param(
            name="device_memory",
            type=units.SIZE,
            doc="memory per device",
            default="preset",
            exclusive_minimum=0,
        ),
        Param(
            name="device_flops",
            type=units.FLOPS,
            doc="dense peak per device",
            default="preset",
            exclusive_minimum=0,
        ),
        Param(
            name="intra_node",
            type=units.BANDWIDTH,
            default="preset",
            doc="bandwidth between devices of a node, per direction",
            exclusive_minimum=0,
        ),
        Param(
            name="inter_node",
            type=units.BANDWIDTH,
            default="preset",
            doc="bandwidth between nodes, per device, per direction",
            exclusive_minimum=0,
        ),
        Param(
            name="intra_node_latency",
            type=units.TIME,
            default="5 us",
            doc="latency of a message within a node",
            minimum=0,
        ),
        Param(
            name="inter_node_latency",
            type=units.TIME,
            default="10 us",
            doc="latency of a message between nodes",
            minimum=0,
        ),
        Param(
            name="profile",
            type="string",
            doc="a `parc profile` file (relative to the spec) whose measurements the planner uses",
        ),
    ),
)
