"""The spec's model as the runtime's ``ModelConfig``, and its description.

Takes: a ``ModelSpec`` (``spec.model``). Gives: ``model_config(model)``, the
``ModelConfig`` train.py builds (the same fields, in its order), and
``model_desc(model)``, ``runtime/layout/model_desc.py``'s description of it: module names
and shapes, parameter counts, FLOPs and saved activations. Both are memoized, so the
cost model can ask for every layout it scores. Used by ``settle_training`` (the
parameter count in train.py's docstring), ``partition_layers`` (the TP table) and
``codegen/planner/cost/`` (what a rank holds and computes).
"""

from __future__ import annotations

import functools

from parc.dsl.spec import ModelSpec
from parc.runtime.layout.model_desc import ModelConfig, ModelDesc, describe


@functools.lru_cache(maxsize=256)
def model_config(model: ModelSpec) -> ModelConfig:
    return ModelConfig(
        arch=model.arch.value,
        layers=model.layers,
        hidden=model.hidden,
        heads=model.heads,
        kv_heads=model.kv_heads,
        ffn=model.ffn,
        vocab=model.vocab,
        padded_vocab=model.padded_vocab,
        seq_len=model.seq_len,
        dropout=model.dropout,
        norm_eps=model.norm_eps,
        rope_theta=model.rope_theta,
        tie_embeddings=model.tie_embeddings,
        experts=model.experts,
        top_k=model.top_k,
        # train.py writes EXPERT_FFN whenever there are experts (ffn when the spec leaves it out)
        expert_ffn=model.expert_ffn if model.expert_ffn is not None or not model.experts else model.ffn,
        moe_every=model.moe_every,
        shared_experts=model.shared_experts,
        router=model.router,
        capacity_factor=model.capacity_factor,
        aux_loss=model.aux_loss,
        z_loss=model.z_loss,
    )


@functools.lru_cache(maxsize=256)
def model_desc(model: ModelSpec) -> ModelDesc:
    return describe(model_config(model))
