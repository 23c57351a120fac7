"""Pass 5: the tensor-parallel table — how each module's weight is split over tp.

Takes: a buildable ``Spec`` and ``draft.mesh``. Gives: ``draft.tensor_parallel``, one
``ShardRule`` per module in model order, with the split dim and the full and local
weight shapes. The Megatron pairing: q/k/v and the MLP's up (and gate) projections
are column-parallel, their consumers o_proj and down_proj row-parallel, so each
block needs one all-reduce in forward; the embedding is split by vocab rows and the
head produces vocab-parallel logits for the vocab-parallel cross-entropy. Norms and
the position embedding are replicated. With tp = 1 every module is replicated. tp divides every split size
(``runtime/layout/constraints/``, checked by ``check_buildable``); on a 2D grid of R × C ranks
(``MeshPlan.tp_grid``) the local shape is one rank's box of it (``model_counts.grid_shape``: C and R divide instead).

Module names, shapes and split dims are the model description's
(``runtime/layout/model_desc.py``, which ``model.py`` is checked against), ``*`` the layer index.

Before: ``resolve_mesh``. After: ``place_sequence_parallel``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.layout.model_counts import grid_shape
from parc.runtime.layout.model_desc import ModuleDesc

from ..errors import InternalError
from ..plan import ShardRule, ShardStyle, TensorParallelPlan
from .draft import Draft

REPLICATE = ShardStyle.REPLICATE


def model_modules(spec: Spec) -> tuple[ModuleDesc, ...]:
    """One module per name pattern (``layers.*.attn.q_proj``), in model order, from the
    model description (runtime/layout/model_desc.py); every block must agree on the shapes."""
    rows: dict[str, ModuleDesc] = {}
    for module in spec.model.desc.modules:
        first = rows.setdefault(module.pattern, module)
        if first.weight.shape != module.weight.shape:  # per-layer shapes need per-layer rules
            raise InternalError(
                "partition_layers", f"{module.name} has shape {module.weight.shape}, {first.name} "
                f"{first.weight.shape}: one TP_PLAN row cannot describe both"
            )
    return tuple(rows.values())


def run(spec: Spec, draft: Draft) -> Draft:
    tp = draft.mesh.size("tp")
    grid = draft.mesh.tp_grid  # Note [2D tensor parallelism]
    rules = []
    for module in model_modules(spec):
        weight = module.weight
        style = REPLICATE if tp == 1 or module.style is None else ShardStyle(module.style)
        dim = None if style is REPLICATE else weight.split_dim
        local = weight.shape if dim is None else weight.local_shape(tp) if grid is None else grid_shape(module, weight, grid)
        rules.append(
            ShardRule(
                pattern=module.pattern, style=style, dim=dim, full_shape=weight.shape, local_shape=local,
                tied_to=module.tied_to,
            )
        )
    plan = TensorParallelPlan(size=tp, rules=tuple(rules), span=draft.mesh.axis("tp").span)
    return replace(draft, tensor_parallel=plan)
