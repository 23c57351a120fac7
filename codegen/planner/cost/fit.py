"""A profiled CPU's GEMM efficiency and per-op cost, fitted to its measured reference steps.

Takes: ``Hardware`` read from a ``parc profile`` file (``cost/hardware.py``). Gives:
``fitted(hw)``, the same hardware with ``gemm_scale`` and ``op_overhead`` fitted so that
the time model (``cost/time.py``) predicts the profile's reference steps; hardware
without reference steps is returned unchanged. Before: ``cost/hardware.py``,
``cost/time.py``. After: ``hardware_for``.

Note [fitting the reference steps]: ``parc profile`` times a few small models' training
steps on one rank (``planner/profile.py``, Note [reference steps]), every rank at once. The
profile's own figures miss part of such a step: its matmul table is square products,
while a step runs rectangular and transposed ones (a backward's dW = dYᵀ·X), and its op
cost is a scalar chain, while a step's ops touch real tensors, allocate and zero
gradients. On one rank the model's step time is linear in the two figures those misses
land in, t = a·gemm_scale + b·op_overhead + c (a: the step's GEMM seconds at the table's
rate, b: the ops it dispatches, c: everything else — elementwise work from the measured
per-element costs, the optimizer's bytes), so the fit is a least-squares solve on the
relative error of each reference step. The reference models are chosen so that one is
dominated by op dispatch and another by GEMMs; a solve that would make either figure
non-positive keeps the measured op cost and fits ``gemm_scale`` alone. The fitted
figures then hold for every layout: tensor parallelism changes the GEMM shapes and the
op counts, not the rates. A fitted ``gemm_scale`` below 1 says the training GEMMs ran
faster than the table's best square product, so the table's best rate is no longer the
CPU's peak: the peak (what MFU divides by) rises to that best rate over ``gemm_scale``,
the fastest rate the model lets a GEMM run at, and MFU stays at most 100%. A peak the
spec gave (``mesh.device_flops``) is kept.
"""

from __future__ import annotations

import os

from dataclasses import replace

from parc.dsl.spec import Arch, Kernels, MeshSpec, ModelSpec, ParallelSpec, Spec, TrainSpec

from .hardware import Hardware, from_mesh, from_profile
from .layout import Layout
from .time import step_time

GEMM_SCALE_RANGE = (0.5, 4.0)
"""Bounds on the fitted ``gemm_scale``: outside them the references measured something
other than GEMMs (a machine busy with other work), and the bound is kept."""


def fitted(hw: Hardware) -> Hardware:
    """Note [fitting the reference steps]."""
    if not hw.reference_steps:
        return hw
    same_load = replace(hw, devices_per_node=max(1, hw.profiled_ranks))  # as the profile ran
    rows = []
    for ref in hw.reference_steps:
        spec, layout = reference_spec(ref)

        def predict(gemm_scale: float, op_overhead: float) -> float:
            machine = replace(same_load, gemm_scale=gemm_scale, op_overhead=op_overhead)
            return step_time(spec, layout, machine).step

        base = predict(0.0, 0.0)
        rows.append((predict(1.0, 0.0) - base, (predict(0.0, 1e-6) - base) / 1e-6, base, float(ref["step_s"])))
    gemm_scale, op_overhead = _solve(rows, hw.op_overhead)
    low, high = GEMM_SCALE_RANGE
    gemm_scale = min(high, max(low, gemm_scale))
    peak = hw.peak_flops
    if hw.peak_from_table and gemm_scale < 1:
        peak /= gemm_scale  # the table's best rate was the peak; a faster GEMM raises it
    return replace(hw, gemm_scale=gemm_scale, op_overhead=op_overhead, peak_flops=peak)


def _solve(rows, measured_op_overhead: float) -> tuple[float, float]:
    """Least squares of Σ((a·g + b·o + c − t) / t)² over (g, o); o > 0 and g > 0, else
    o stays the measured one and g alone is fitted."""
    saa = sab = sbb = sar = sbr = 0.0
    for a, b, c, t in rows:
        a, b, r = a / t, b / t, (t - c) / t
        saa, sab, sbb, sar, sbr = saa + a * a, sab + a * b, sbb + b * b, sar + a * r, sbr + b * r
    det = saa * sbb - sab * sab
    if len(rows) >= 2 and det > 1e-12 * max(saa * sbb, 1e-300):
        g, o = (sar * sbb - sab * sbr) / det, (saa * sbr - sab * sar) / det
        if g > 0 and o > 0:
            return g, o
    num = sum((a / t) * ((t - c - b * measured_op_overhead) / t) for a, b, c, t in rows)
    den = sum((a / t) ** 2 for a, b, c, t in rows)
    return (num / den if den > 0 else 1.0), measured_op_overhead


def reference_spec(ref: dict) -> tuple[Spec, Layout]:
    """The one-rank spec and layout of a profile's reference step."""
    arch = Arch(ref["arch"])
    model = ModelSpec.of(
        name="reference", arch=arch, layers=ref["layers"], hidden=ref["hidden"], heads=ref["heads"],
        kv_heads=ref["kv_heads"], ffn=ref["ffn"], vocab=ref["vocab"], seq_len=ref["seq_len"],
        pad_vocab_to=1, tie_embeddings=arch is Arch.GPT,
    )
    mesh = MeshSpec(nodes=1, devices_per_node=1, device="cpu", device_memory=None, device_flops=None,
                    intra_node=1e9, inter_node=1e9)
    micro_batch, micro_batches = ref["micro_batch"], ref["micro_batches"]
    train = TrainSpec(global_batch=micro_batch * micro_batches, micro_batch=micro_batch, steps=1,
                      kernels=Kernels(ref.get("kernels", "compiled")))
    parallel = ParallelSpec(dp=1, tp=1, pp=1)
    layout = Layout(dp=1, tp=1, pp=1, sp=False, zero=0, schedule="1f1b", chunks=1, recompute="none",
                    micro_batch=micro_batch)
    return Spec(model=model, mesh=mesh, parallel=parallel, train=train, source="reference"), layout


def hardware_for(spec: Spec, *, base_dir: str | None = None) -> Hardware:
    """The hardware of ``spec.mesh``; a named profile (relative to the spec) overrides the
    preset, with the GEMM and per-op figures fitted to its reference steps (``fitted``).

    Here, not in ``hardware.py``: the fit runs the time model, which reads hardware."""
    mesh = spec.mesh
    profile = getattr(mesh, "profile", None)
    if profile:
        folder = base_dir if base_dir is not None else os.path.dirname(spec.source)
        return fitted(from_profile(mesh, os.path.join(folder, profile), named=profile))
    return from_mesh(mesh)
