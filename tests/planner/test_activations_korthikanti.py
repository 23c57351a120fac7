"""parc's per-layer activation count (Note [what parc's trainer saves]) against Korthikanti
et al. 2022's (Table 2), term by term, on GPT-3 175B's shape, and the Megatron
accounting's activations under context parallelism. Torch-free: the formulas only (the
count against the trainer's measured tensors is tests/planner/test_formulas.py's).

Korthikanti's 34·s·b·h bytes of a GPT layer are, per token (fp16, h hidden): the two
LayerNorm inputs 4h, the QKV input 2h, Q and K 4h, V 2h, the attention output (the
output projection's input) 2h, the MLP input 2h, GeLU's input and output 16h, two dropout
masks 2h; the attention scores add 5·a·s (the softmax's output, its dropout mask and the
dropout's output: 2 + 1 + 2 bytes a score). Under tp the 24h of the heads and the
ffn are split; under sp all 34h. Selective recompute drops the 5as term; full keeps
the layer input. parc's block (dropout 0, its default; flash attention) saves the same
tensors but the dropout masks and the scores (flash keeps a log-sum-exp of a values a
token instead), plus the norms' statistics. Under sp the column linears save their input's shard and
gather it again in backward, as Megatron does (Note [sp inputs saved as shards] in
runtime/parallel/tensor/sp_columns.py); they kept the gathered input whole before, 4h(1 − 1/t)
bytes a token more, which had a 405B layout of the Llama 3 report (tp 8, sp, 8K) hold twice
Megatron's activations.
"""

from __future__ import annotations

import pytest

from parc.codegen.planner.cost.layout import Accounting, Layout
from parc.codegen.planner.cost.memory import activation_bytes, korthikanti_layer_bytes, parc_layer_elements
from parc.dsl import load_text

H, A, S = 12288, 96, 2048  # GPT-3 175B's hidden, heads, sequence

GPT3 = f"""
model gpt3 {{
  arch = gpt
  layers = 96
  hidden = {H}
  heads = {A}
  ffn = {4 * H}
  vocab = 51200
  seq_len = {S}
}}
mesh {{
  nodes = {{nodes}}
  devices_per_node = 8
  device = a100-80gb
}}
parallel {{
  dp = 1
  tp = 8
  pp = 8
  cp = {{cp}}
}}
train {{
  global_batch = 16
  micro_batch = 1
  steps = 1
  precision = bf16
}}
"""


def _model(cp: int = 1):
    return load_text(GPT3.replace("{cp}", str(cp)).replace("{nodes}", str(8 * cp)), "gpt3.par", buildable=False)


def _parc_bytes(tp: int, sp: bool, recompute: str) -> float:
    """parc's saved bytes per token of one block, 2 bytes an element (bf16)."""
    return 2.0 * parc_layer_elements(_model().model, tp=tp, sp=sp, recompute=recompute, micro_batch=1)


def _korthikanti(tp: int, sp: bool, recompute: str) -> float:
    """Korthikanti's bytes per token of one layer."""
    return korthikanti_layer_bytes(seq=S, micro_batch=1, hidden=H, heads=A, tp=tp, sp=sp, recompute=recompute) / S


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_tensor_parallel_is_korthikanti_less_dropout_masks(tp):
    """tp without sp, selective (no scores either side): the same tensors but the two 1-byte
    dropout masks (2h), plus parc's norm statistics (mean and rstd of two norms, 4 values)."""
    assert _parc_bytes(tp, False, "selective") == pytest.approx(_korthikanti(tp, False, "selective") - 2 * H + 2 * 4)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_sequence_parallel_is_korthikanti_less_dropout_masks(tp):
    """tp with sp, selective: Korthikanti's 34h/t less the masks (2h/t), plus the statistics
    (sharded with the norms: 8/t). The column linears save their input's shard and gather it
    again in backward, as Megatron does (Note [sp inputs saved as shards]); they kept it whole,
    4h(1 − 1/t) bytes a token more, before."""
    expected = _korthikanti(tp, True, "selective") - 2 * H / tp + 8 / tp
    assert _parc_bytes(tp, True, "selective") == pytest.approx(expected)


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
def test_no_recompute_adds_the_log_sum_exp_where_korthikanti_adds_the_scores(tp, sp):
    """Flash attention keeps a log-sum-exp value per head and token (a/t), not the 5·a·s
    bytes a token of the materialized scores, softmax and dropout mask."""
    assert _parc_bytes(tp, sp, "none") - _parc_bytes(tp, sp, "selective") == pytest.approx(2 * A / tp)
    scores = _korthikanti(tp, sp, "none") - _korthikanti(tp, sp, "selective")
    assert scores == pytest.approx(5 * A * S / tp)


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
def test_full_recompute_is_korthikanti(tp, sp):
    assert _parc_bytes(tp, sp, "full") == pytest.approx(_korthikanti(tp, sp, "full"))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_megatron_activations_follow_context_parallel(recompute):
    """Under cp a rank holds its T/cp tokens of every layer, and their scores against the
    whole sequence's keys: the Megatron accounting's activations fall cp× (they counted the
    whole sequence on every cp rank)."""
    layout = Layout(dp=1, tp=8, pp=8, sp=True, zero=0, schedule="1f1b", chunks=1, recompute=recompute,
                    micro_batch=1)
    whole = activation_bytes(_model(1), layout, 0, Accounting.MEGATRON)
    split = activation_bytes(_model(4), Layout(**{**_fields(layout), "cp": 4}), 0, Accounting.MEGATRON)
    in_flight, layers = 8, 96 // 8  # 1f1b, rank 0 of 8 stages
    per_layer = korthikanti_layer_bytes(seq=S // 4, micro_batch=1, hidden=H, heads=A, tp=8, sp=True,
                                        recompute=recompute, keys=S)
    assert split == pytest.approx(in_flight * layers * per_layer)
    assert split == pytest.approx(whole / 4)


def _fields(layout: Layout) -> dict:
    return {name: getattr(layout, name) for name in layout.__dataclass_fields__}
