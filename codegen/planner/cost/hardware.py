"""The machine as the cost model sees it: peaks, efficiencies, links, overheads.

Takes: a ``MeshSpec`` (the preset's figures, or the spec's explicit numbers) and,
when the mesh names one, a profile written by ``parc profile``. Gives:
``Hardware`` and ``hardware_for(spec)``. Used by ``cost/time.py`` and
``cost/memory.py``; before them: ``parc.dsl``.

Note [size-dependent efficiency]: a GEMM reaches a fraction of the device peak that
grows with its smallest dimension n: ``eff(n) = eff_max · n / (n + n_half)`` on a
GPU (the roofline's ramp: small matrices starve the tensor cores). ``eff_max`` and
``n_half`` of the A100 presets are fitted on Megatron-LM's SC21 rows
(``bench/planner_calibration.py`` prints the fit); the other GPU presets reuse them
(an assumption: same software stack, same shape of ramp). A profiled machine uses
its measured table instead: matmul FLOP/s by size, interpolated in log size.
Elementwise work is memory-bound (bytes moved / memory bandwidth) and every op
dispatched costs ``op_overhead`` seconds (launch or Python dispatch; it dominates
tiny models on a CPU).
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass

from parc.dsl.spec import MeshSpec, Spec

from ...json_input import InputError, load_checked

# Note [size-dependent efficiency]: the fit of bench/planner_calibration.py on the
# three SC21 rows (DGX A100, Megatron-LM 2021: fused kernels, no flash attention).
GPU_EFFICIENCY = {"eff_max": 0.70, "n_half": 10.0}
ZERO3_NETWORK = {"zero3_network": 1.11, "zero3_overlap": 0.34}
"""Note [ZeRO-3 gathers] (cost/time.py): the share of one port per GPU that ZeRO-3's
per-unit collectives reach across nodes, and the share of a block's compute that runs at
full speed under them; fitted on the published ZeRO-3 rows of 175B
(``bench/planner_calibration.py --zero3``; the 530B rows held out), DeepSpeed's six
all-gathers a block each paying the ring's latency (``zero3.zero3_gathers_per_unit``)."""
ATTENTION_EFFICIENCY = {
    "a100-40gb": (0.65, 0.55),
    "a100-80gb": (0.65, 0.55),
    "rtx3090": (0.65, 0.55),
    "h100-80gb": (0.35, 0.30),
    "h200": (0.35, 0.30),
}
"""Note [flash attention's rate]: (forward, backward) FLOP/s of the causal attention core
over the device's peak, for parc's trainer on a GPU preset (``F.scaled_dot_product_attention``,
whose CUDA flash backend is FlashAttention-2). Sources, read from memory of the papers'
figures (causal, head dim 128, 8K–16K tokens), rounded: Dao, "FlashAttention-2"
(2023), A100: forward ≈ 200, backward ≈ 170 of 312 TFLOP/s; Shah et al.,
"FlashAttention-3" (2024), H100: FlashAttention-2 reaches ≈ 35% of the bf16 peak forward
and less backward (≈ 300 of 989 TFLOP/s), where FlashAttention-3 reaches ≈ 75% forward.
Not fitted to any published training run (bench/planner_published.py holds those out).
Before, the core was priced as two GEMMs at the GEMM ramp of its head dim (≈ 65% of peak
for D = 128) with a backward of twice its forward: at 128K tokens, where the attention
square is most of the work, ~45% too fast."""
ATTENTION_BACKWARD_FLOPS = 2.5
"""Flash attention's backward over its forward in FLOPs: it recomputes S = QKᵀ and runs
dV, dP, dQ, dK, five products where forward runs two (Dao 2023, Algorithm 2)."""
GPU_OP_OVERHEAD = 4e-6
"""Seconds per kernel launch (CUDA launch latency, a few µs)."""
HBM_BANDWIDTH = {
    "a100-40gb": 1.555e12,
    "a100-80gb": 2.039e12,
    "h100-80gb": 3.35e12,
    "h200": 4.8e12,
    "rtx3090": 0.936e12,
}
"""Bytes/s, from ../shared/reference/README.md."""
MEMORY_BANDWIDTH_EFFICIENCY = 0.8
"""Fraction of the HBM peak an elementwise kernel streams at."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    bandwidth: float
    """Bytes/s per device, per direction."""
    latency: float
    """Seconds per message hop (the α of the α–β model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """A measured collective: time(bytes) = latency + bytes / bandwidth, for ``ranks``."""

    ranks: int
    latency: float
    bandwidth: float
    """Bytes of the buffer per second (algorithm bandwidth, not bus bandwidth)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    name: str
    peak_flops: float
    """Dense FLOP/s of one device at the training precision."""
    memory: float | None
    """Bytes per device; None when unknown (everything fits)."""
    memory_bandwidth: float
    """Bytes/s an elementwise kernel streams at."""
    devices_per_node: int
    intra: Link
    inter: Link
    op_overhead: float
    """Seconds per op dispatched (forward or backward), beyond its arithmetic."""
    eff_max: float = GPU_EFFICIENCY["eff_max"]
    n_half: float = GPU_EFFICIENCY["n_half"]
    zero3_network: float = ZERO3_NETWORK["zero3_network"]
    zero3_overlap: float = ZERO3_NETWORK["zero3_overlap"]
    """Note [ZeRO-3 gathers]: ``ZERO3_NETWORK``."""
    matmul_table: tuple[tuple[float, float], ...] = ()
    """Measured (n, FLOP/s) of n×n×n matmuls, ascending n; empty: use eff_max, n_half."""
    collectives: tuple[tuple[str, Collective], ...] = ()
    """Measured collectives by name (all_reduce, all_gather, reduce_scatter, send_recv)."""
    profile: str | None = None
    """The profile file the figures came from, as the spec named it."""
    peak_from_table: bool = False
    """``peak_flops`` is the matmul table's best rate (a profile, no ``mesh.device_flops``):
    the fit may raise it (``cost/fit.py``, Note [fitting the reference steps])."""
    cores: int | None = None
    """CPU cores the ranks of a node share (a profiled CPU); None: a device per rank."""
    profiled_ranks: int = 1
    """Ranks that ran at once while the profile measured (its figures are per rank then)."""
    gemm_scale: float = 1.0
    """A training GEMM's time over the matmul table's square product of the same smallest
    dimension (fitted to a profile's reference steps: ``cost/fit.py``; 1 for presets)."""
    reference_steps: tuple[dict, ...] = ()
    """A profile's measured reference training steps (``planner/profile.py``, Note [reference steps])."""
    elementwise: tuple[tuple[str, float], ...] = ()
    """Measured seconds per element, forward and backward, keyed ``mode.op`` (``eager.gelu``,
    ``compiled.layer_norm``, ...); empty: elementwise work streams at the memory bandwidth."""
    attention: tuple[float, float] | None = None
    """Note [flash attention's rate]: (forward, backward) fraction of ``peak_flops`` the
    causal attention core reaches; None (a profiled or unknown device): two GEMMs at
    ``matmul_flops`` of the head dim, backward twice the forward."""

    def attention_time(self, flops: float) -> tuple[float, float]:
        """(forward, backward) seconds of an attention core of ``flops`` forward FLOPs."""
        if self.attention is None:
            return 0.0, 0.0
        forward, backward = self.attention
        return (flops / (self.peak_flops * forward),
                ATTENTION_BACKWARD_FLOPS * flops / (self.peak_flops * backward))

    def elementwise_cost(self, mode: str, op: str) -> float | None:
        for key, value in self.elementwise:
            if key == f"{mode}.{op}":
                return value
        return None

    @property
    def comm_on_cores(self) -> bool:
        """A profiled CPU: collectives (gloo) run on the cores the ranks compute on, so
        compute cannot hide them (``cost/time.py``)."""
        return self.cores is not None

    @property
    def contention(self) -> float:
        """Slow-down of a rank when the mesh puts more ranks on a CPU node's cores than ran
        while profiling (figures measured with N ranks at once already include N)."""
        if not self.cores:
            return 1.0
        now = max(1.0, self.devices_per_node / self.cores)
        then = max(1.0, self.profiled_ranks / self.cores)
        return now / then

    def matmul_flops(self, n: float) -> float:
        """FLOP/s of a GEMM whose smallest dimension is n (Note [size-dependent efficiency])."""
        table = self.matmul_table
        if not table:
            return self.peak_flops * self.eff_max * n / (n + self.n_half)
        sizes = [size for size, _ in table]
        if n <= sizes[0]:
            return table[0][1] * n / sizes[0]  # below the table: the ramp goes on linearly
        if n >= sizes[-1]:
            return table[-1][1]
        i = bisect.bisect_right(sizes, n)
        (n0, f0), (n1, f1) = table[i - 1], table[i]
        w = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
        return f0 + w * (f1 - f0)

    def collective(self, name: str) -> Collective | None:
        for key, value in self.collectives:
            if key == name:
                return value
        return None


def from_mesh(mesh: MeshSpec) -> Hardware:
    peak = mesh.device_flops
    if peak is None:  # cpu without a profile: a modest guess, flagged in the plan's title
        peak = 50e9
    return Hardware(
        name=mesh.device,
        peak_flops=float(peak),
        memory=mesh.device_memory,
        memory_bandwidth=HBM_BANDWIDTH.get(mesh.device, 20e9) * MEMORY_BANDWIDTH_EFFICIENCY,
        devices_per_node=mesh.devices_per_node,
        intra=Link(bandwidth=mesh.intra_node, latency=mesh.intra_node_latency),
        inter=Link(bandwidth=mesh.inter_node, latency=mesh.inter_node_latency),
        op_overhead=GPU_OP_OVERHEAD if mesh.device != "cpu" else 10e-6,
        attention=ATTENTION_EFFICIENCY.get(mesh.device),
    )


class ProfileError(Exception):
    """The profile a spec names cannot be read (the message says why)."""


_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_COUNT = {"type": "integer", "minimum": 1}
PROFILE_SCHEMA = {
    "type": "object",
    "required": ["matmul", "memory_bandwidth", "op_overhead_s"],
    "properties": {
        "version": {"type": "integer", "minimum": 1},
        "matmul": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "required": ["n", "flops"], "properties": {"n": _POSITIVE, "flops": _POSITIVE}},
        },
        "memory_bandwidth": _POSITIVE,
        "op_overhead_s": _POSITIVE,
        "memory_bytes": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "cores": {"type": ["integer", "null"], "minimum": 1},
        "ranks": _COUNT,
        "collectives": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["ranks", "latency_s", "bandwidth"],
                "properties": {"ranks": _COUNT, "latency_s": {"type": "number", "minimum": 0}, "bandwidth": _POSITIVE},
            },
        },
        "elementwise": {
            "type": "object",
            "additionalProperties": {"type": "object", "additionalProperties": _POSITIVE},
        },
        "reference_steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["arch", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
                             "micro_batch", "micro_batches", "step_s"],
                "properties": {
                    "arch": {"enum": ["gpt", "llama"]},
                    **{key: _COUNT for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
                                               "micro_batch", "micro_batches")},
                    "kernels": {"enum": ["compiled", "eager"]},
                    "step_s": _POSITIVE,
                },
            },
        },
    },
}
"""What a ``parc profile`` file must hold before the planner divides by any of it (docs/planner.md)."""


def read_profile(path: str) -> dict:
    """The checked document of a profile file; ``ProfileError`` naming the file and the problem."""
    try:
        data = load_checked(path, PROFILE_SCHEMA)
    except InputError as exc:
        raise ProfileError(f"{path} is not a parc profile: {exc.shape}" if exc.shape else f"cannot read the profile: {exc}") from None
    sizes = [row["n"] for row in data["matmul"]]
    if len(set(sizes)) != len(sizes):  # the log-size interpolation divides by their differences
        raise ProfileError(f"{path} is not a parc profile: [\"matmul\"]: two rows have the same n")
    for i, ref in enumerate(data.get("reference_steps", [])):
        if ref["hidden"] % ref["heads"] or ref["heads"] % ref["kv_heads"]:
            raise ProfileError(f"{path} is not a parc profile: [\"reference_steps\"][{i}]: heads must divide "
                               "hidden and kv_heads must divide heads")
    return data


def profile_peak_flops(data: dict) -> float:
    """A profile's peak FLOP/s: its best measured matmul rate (the planner's ``peak_flops``
    without ``mesh.device_flops``, and the trainer's MFU denominator then)."""
    return max(float(row["flops"]) for row in data["matmul"])


def from_profile(mesh: MeshSpec, path: str, *, named: str) -> Hardware:
    """Hardware from a ``parc profile`` JSON file (docs/planner.md, "The profile")."""
    data = read_profile(path)
    table = tuple(sorted((float(row["n"]), float(row["flops"])) for row in data["matmul"]))
    collectives = tuple(
        sorted(
            (
                name,
                Collective(
                    ranks=int(row["ranks"]),
                    latency=float(row["latency_s"]),
                    bandwidth=float(row["bandwidth"]),
                ),
            )
            for name, row in data.get("collectives", {}).items()
        )
    )
    peak = profile_peak_flops(data)
    memory = mesh.device_memory
    if memory is None and data.get("memory_bytes"):
        memory = float(data["memory_bytes"]) / mesh.devices_per_node
    return Hardware(
        name=mesh.device,
        peak_flops=float(mesh.device_flops or peak),
        peak_from_table=not mesh.device_flops,
        memory=memory,
        memory_bandwidth=float(data["memory_bandwidth"]),
        devices_per_node=mesh.devices_per_node,
        intra=Link(bandwidth=mesh.intra_node, latency=mesh.intra_node_latency),
        inter=Link(bandwidth=mesh.inter_node, latency=mesh.inter_node_latency),
        op_overhead=float(data["op_overhead_s"]),
        matmul_table=table,
        collectives=collectives,
        profile=named,
        cores=data.get("cores"),
        profiled_ranks=int(data.get("ranks", 1)),
        reference_steps=tuple(dict(row) for row in data.get("reference_steps", [])),
        elementwise=tuple(
            sorted(
                (f"{mode}.{op}", float(seconds))
                for mode, ops in data.get("elementwise", {}).items()
                for op, seconds in ops.items()
            )
        ),
    )


def gemm_time(hw: Hardware, m: float, n: float, k: float) -> float:
    """Seconds of one (m × k)·(k × n) product: 2·m·n·k FLOPs at the matmul rate of its
    smallest dimension (Note [size-dependent efficiency]), times the machine's GEMM scale."""
    return 2.0 * m * n * k / hw.matmul_flops(min(m, n, k)) * hw.gemm_scale
