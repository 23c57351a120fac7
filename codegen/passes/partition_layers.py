"""Pass 5: the tensor-parallel table — how each module's weight is split over tp.

Takes: a buildable ``Spec`` and ``draft.mesh``. Gives: ``draft.tensor_parallel``, one
``ShardRule`` per module in model order, with the split dim and the full and local
weight shapes. The Megatron pairing: q/k/v and the MLP's up (and gate) projections
are column-parallel, their consumers o_proj and down_proj row-parallel, so each
block needs one all-reduce in forward; the embedding is split by vocab rows and the
head produces vocab-parallel logits for the vocab-parallel cross-entropy. Norms and
the position embedding are replicated. With tp = 1 every module is replicated.

Module names, shapes and split dims are the model description's
(``runtime/model_desc.py``, which ``model.py`` is checked against), ``*`` the layer index.

Before: ``resolve_mesh``. After: ``place_sequence_parallel``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.model_desc import ModuleDesc

from ..errors import NOT_DIVISIBLE, InternalError, check, error
from ..model_config import model_desc
from ..plan import ShardRule, ShardStyle, TensorParallelPlan
from .draft import Draft

REPLICATE = ShardStyle.REPLICATE


def model_modules(spec: Spec) -> tuple[ModuleDesc, ...]:
    """One module per name pattern (``layers.*.attn.q_proj``), in model order, from the
    model description (runtime/model_desc.py); every block must agree on the shapes."""
    rows: dict[str, ModuleDesc] = {}
    for module in model_desc(spec.model).modules:
        first = rows.setdefault(module.pattern, module)
        if first.weight.shape != module.weight.shape:  # per-layer shapes need per-layer rules
            raise InternalError(
                "partition_layers", f"{module.name} has shape {module.weight.shape}, {first.name} "
                f"{first.weight.shape}: one TP_PLAN row cannot describe both"
            )
    return tuple(rows.values())


def divisibility_errors(spec: Spec, tp: int) -> list:
    m = spec.model
    problems = []
    if m.hidden % m.heads:
        problems.append(
            error(spec, "model.heads", NOT_DIVISIBLE, f"heads = {m.heads} does not divide hidden = {m.hidden}")
        )
    if m.heads % m.kv_heads:
        problems.append(
            error(
                spec,
                "model.kv_heads",
                NOT_DIVISIBLE,
                f"kv_heads = {m.kv_heads} does not divide heads = {m.heads}",
            )
        )
    for key, value in (
        ("heads", m.heads),
        ("kv_heads", m.kv_heads),
        ("ffn", m.ffn),
        ("padded_vocab", m.padded_vocab),
    ):
        if value % tp:
            what = f"{key} = {value}" if key != "padded_vocab" else (
                f"the padded vocab = {value} (vocab {m.vocab} rounded up to a multiple of "
                f"{m.pad_vocab_to})"
            )
            problems.append(
                error(
                    spec,
                    "parallel.tp",
                    NOT_DIVISIBLE,
                    f"tp = {tp} does not divide {what}",
                    f"tp must divide {key}: one of {', '.join(map(str, divisors(value)))}",
                )
            )
    return problems


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))[:12]


def run(spec: Spec, draft: Draft) -> Draft:
    tp = draft.mesh.size("tp")
    check(divisibility_errors(spec, tp))
    rules = []
    for module in model_modules(spec):
        weight = module.weight
        style = REPLICATE if tp == 1 or module.style is None else ShardStyle(module.style)
        dim = None if style is REPLICATE else weight.split_dim
        local = weight.shape if dim is None else weight.local_shape(tp)
        rules.append(
            ShardRule(
                pattern=module.pattern, style=style, dim=dim, full_shape=weight.shape, local_shape=local,
                tied_to=module.tied_to,
            )
        )
    plan = TensorParallelPlan(size=tp, rules=tuple(rules), span=draft.mesh.axis("tp").span)
    return replace(draft, tensor_parallel=plan)
