"""The bytes the time model moves are the trainer's dtypes: elementwise work (norms,
activations, residual adds, the experts' permutations) streams 2 bytes an element under
bf16 parameters and 4 under fp32 (``layout.streamed_element``; it streamed 4 whatever the
precision while the memory model counted the same activations at 2), and a pipeline
stage sends fp32 whatever the compute dtype (``time.pipeline_element``,
runtime/parallel/pipeline/pipeline.py; it was priced at the activations' 2 bytes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parc.codegen.planner.cost import Accounting, hardware_for
from parc.codegen.planner.cost.comm import collective_time
from parc.codegen.planner.cost.time import block_costs, step_time
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load_text

SPEC = """
model m {{
  arch = llama
  layers = 8
  hidden = 2048
  heads = 16
  kv_heads = 4
  ffn = 5632
  vocab = 32000
  seq_len = 4096
{experts}}}
mesh {{
  nodes = 1
  devices_per_node = {ranks}
  device = h100-80gb
}}
parallel {{
  dp = {dp}
  tp = 1
  pp = {pp}
  recompute = none
  schedule = 1f1b
}}
train {{
  global_batch = 16
  micro_batch = 2
  steps = 1
  precision = {precision}
}}
"""


def _spec(precision: str, *, moe: bool = False, dp: int = 1, pp: int = 1):
    experts = "  experts = 8\n  top_k = 2\n" if moe else ""
    text = SPEC.format(precision=precision, experts=experts, dp=dp, pp=pp, ranks=dp * pp)
    return load_text(text, "m.par", buildable=False)


def _bandwidth_bound(spec) -> float:
    """One block's forward seconds that go with the memory bandwidth (what an infinite
    bandwidth would save), parc's accounting."""
    layout = fixed_layout(spec)
    hw = hardware_for(spec)
    key = layout.block_settings(spec.model.layers)[0]

    def forward(bandwidth: float) -> float:
        return block_costs(spec, layout, replace(hw, memory_bandwidth=bandwidth), Accounting.PARC, key,
                           layers_per_chunk=1)[0]

    return forward(hw.memory_bandwidth) - forward(1e30)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_bf16_parameters_stream_half_the_bytes_of_fp32(moe):
    bf16, fp32 = _bandwidth_bound(_spec("bf16", moe=moe)), _bandwidth_bound(_spec("fp32", moe=moe))
    assert bf16 > 0
    assert bf16 == pytest.approx(fp32 / 2, rel=1e-9)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_pipeline_messages_are_fp32_whatever_the_compute_dtype(precision):
    spec = _spec(precision, pp=2)
    layout = fixed_layout(spec)
    hw = hardware_for(spec)
    time = step_time(spec, layout, hw, Accounting.PARC)
    micro_batches = layout.grad_accum(spec.train.global_batch)
    message = layout.tokens(spec.model.seq_len) * spec.model.hidden * 4.0  # fp32 (b, s, h)
    p2p = collective_time(hw, "send_recv", message, size=2, stride=layout.tp * layout.cp * layout.dp)
    assert time.pp_comm == pytest.approx(2 * micro_batches * p2p)
    megatron = step_time(spec, layout, hw, Accounting.MEGATRON)  # Megatron sends its fp16 activations
    half = collective_time(hw, "send_recv", message / 2, size=2, stride=layout.tp * layout.cp * layout.dp)
    assert megatron.pp_comm == pytest.approx(2 * micro_batches * half)
