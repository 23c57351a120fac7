"""A ``Spec`` as the plain values of ``runtime/layout/constraints/``, and its violations as errors.

Takes: a ``Spec`` (``None`` where the spec says ``auto``). Gives: ``spec_values(spec)``,
the values by the names of ``constraints.KEYS``, and ``rule_errors(spec, kinds)``, a
``ParcError`` for each violated rule at the spec text it blames, with the code and
message ``parc check`` gives for it. ``dsl/checks.py`` does the same for the
normalized document, so the front end and the build read one set of rules. Used by
``passes/check_values.py``, ``passes/check_buildable.py``, ``search.py`` and the cost
model's ``buildable``.
"""

from __future__ import annotations

from parc.dsl.diagnostics import ParcError
from parc.dsl.keys import MOE_KEYS
from parc.dsl import parallel_fields
from parc.dsl.spec import Spec
from parc.runtime.layout import constraints

from .errors import span_of


_PARALLEL = tuple(name for name, key in constraints.KEYS.items() if key.startswith("parallel."))
"""The rules' values that are fields of ``ParallelSpec`` (``runtime/layout/rule_engine.KEYS``)."""


def spec_values(spec: Spec) -> dict:
    m, mesh, par, train = spec.model, spec.mesh, spec.parallel, spec.train
    kv_written = spec.span("model.kv_heads") is not None or m.kv_heads != m.heads
    return {
        "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "kv_heads": m.kv_heads if kv_written else None,  # the default (= heads) adds nothing to check
        "experts": m.experts, "top_k": m.top_k, "expert_ffn": m.expert_ffn,
        "first_dense_layers": m.first_dense_layers,
        "moe_written": tuple(k.name for k in MOE_KEYS[1:] if spec.span(f"model.{k.name}") is not None),
        "capacity_factor": m.capacity_factor,
        "ffn": m.ffn, "vocab": m.vocab, "pad_vocab_to": m.pad_vocab_to, "seq_len": m.seq_len, "dropout": m.dropout,
        "tie_embeddings": m.tie_embeddings, "documents": m.documents, "arch": m.arch.value,
        "head_dim": m.head_dim if spec.span("model.head_dim") is not None else None,  # the default: PAR0202's
        "qk_norm": m.qk_norm, "attention_bias": m.attention_bias,
        "nodes": mesh.nodes, "devices_per_node": mesh.devices_per_node,
        **parallel_fields.rule_values(par, _PARALLEL),  # Note [a key is its field]
        "global_batch": train.global_batch, "micro_batch": train.micro_batch, "steps": train.steps,
        "warmup": train.lr_schedule.warmup, "decay": train.lr_schedule.decay or None, "precision": train.precision.value,
        "grad_reduce": train.grad_reduce,
        "optimizer": train.optimizer.name, "data": train.data.kind.value, "data_dtype": train.data.dtype,
        "data_files": len(train.data.files) or None, "data_weights": len(train.data.weights) or None,
        "data_val_files": None if train.data.val_path is None
        else len(train.data.val_path) if isinstance(train.data.val_path, tuple) else 1,
    }


def blamed_span(spec: Spec, violation: constraints.Violation):
    """Where the first written of the blamed keys is (the latest ``--set`` one for the world size)."""
    written = [(key, spec.span(key)) for key in violation.blame if spec.span(key) is not None]
    if violation.blame_latest_set:
        given = [(int(span.file.split()[-1]), span) for _, span in written if span.file.startswith("--set")]
        if given:
            return max(given, key=lambda pair: pair[0])[1]
    return written[0][1] if written else span_of(spec, violation.blame[0])


def rule_errors(spec: Spec, kinds=(constraints.LAYOUT, constraints.BUILD), values: dict | None = None) -> list:
    found = constraints.violations(spec_values(spec) if values is None else values, kinds)
    return [
        ParcError(span=blamed_span(spec, v), code=v.code, message=v.message, hint=v.hint) for v in found
    ]
