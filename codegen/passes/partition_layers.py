"""Pass 5: the tensor-parallel table — how each module's weight is split over tp.

Takes: a buildable ``Spec`` and ``draft.mesh``. Gives: ``draft.tensor_parallel``, one
``ShardRule`` per module in model order, with the split dim and the full and local
weight shapes. The Megatron pairing: q/k/v and the MLP's up (and gate) projections
are column-parallel, their consumers o_proj and down_proj row-parallel, so each
block needs one all-reduce in forward; the embedding is split by vocab rows and the
head produces vocab-parallel logits for the vocab-parallel cross-entropy. Norms and
the position embedding are replicated. With tp = 1 every module is replicated. tp divides every split size
(``runtime/constraints.py``, checked by ``check_buildable``).

Module names are the runtime's (runtime-api.md, model.py), ``*`` the layer index.

Before: ``assign_ranks``. After: ``place_sequence_parallel``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Arch, Spec

from ..plan import Axis, ShardRule, ShardStyle, TensorParallelPlan
from .draft import Draft

COLWISE, ROWWISE = ShardStyle.COLWISE, ShardStyle.ROWWISE
VOCAB, VOCAB_HEAD, REPLICATE = ShardStyle.VOCAB, ShardStyle.VOCAB_HEAD, ShardStyle.REPLICATE


def model_modules(spec: Spec) -> tuple[tuple[str, ShardStyle, tuple[int, ...]], ...]:
    """(name pattern, style when tp > 1, full weight shape) for every module, in order."""
    m = spec.model
    q_out = m.heads * m.head_dim
    kv_out = m.kv_heads * m.head_dim
    rows = [("embed", VOCAB, (m.padded_vocab, m.hidden))]
    if m.arch is Arch.GPT:
        rows.append(("pos_embed", REPLICATE, (m.seq_len, m.hidden)))
    rows += [
        ("layers.*.attn_norm", REPLICATE, (m.hidden,)),
        ("layers.*.attn.q_proj", COLWISE, (q_out, m.hidden)),
        ("layers.*.attn.k_proj", COLWISE, (kv_out, m.hidden)),
        ("layers.*.attn.v_proj", COLWISE, (kv_out, m.hidden)),
        ("layers.*.attn.o_proj", ROWWISE, (m.hidden, q_out)),
        ("layers.*.mlp_norm", REPLICATE, (m.hidden,)),
    ]
    if m.arch is Arch.LLAMA:
        rows.append(("layers.*.mlp.gate_proj", COLWISE, (m.ffn, m.hidden)))
    rows += [
        ("layers.*.mlp.up_proj", COLWISE, (m.ffn, m.hidden)),
        ("layers.*.mlp.down_proj", ROWWISE, (m.hidden, m.ffn)),
        ("final_norm", REPLICATE, (m.hidden,)),
        ("head", VOCAB_HEAD, (m.padded_vocab, m.hidden)),
    ]
    return tuple(rows)


SPLIT_DIM = {COLWISE: 0, ROWWISE: 1, VOCAB: 0, VOCAB_HEAD: 0}


def run(spec: Spec, draft: Draft) -> Draft:
    tp = draft.mesh.size(Axis.TP)
    rules = []
    for pattern, style, shape in model_modules(spec):
        if tp == 1:
            style = REPLICATE
        dim = SPLIT_DIM.get(style)
        local = shape if dim is None else tuple(n // tp if d == dim else n for d, n in enumerate(shape))
        tied = "embed" if pattern == "head" and spec.model.tie_embeddings else None
        rules.append(
            ShardRule(
                pattern=pattern, style=style, dim=dim, full_shape=shape, local_shape=local, tied_to=tied
            )
        )
    plan = TensorParallelPlan(size=tp, rules=tuple(rules), span=draft.mesh.axis(Axis.TP).span)
    return replace(draft, tensor_parallel=plan)
