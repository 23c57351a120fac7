"""What a parameter is to the code that reduces, clips, shards and saves it: one record.

Takes: nothing. Gives: ``ParamRole``, ``role(param)`` (the parameter's role, or the
plain one) and ``assign(param, **changes)``. The transform that makes a parameter sets
its role (``parallelize``'s steps and the layers they swap in: ``layers.py``,
``layers2d.py``, ``sharding.py``, ``moe.py``; the model for tied and replicated stages' copies);
every reader asks ``role(p)`` instead of a loose attribute. A role travels with the
parameter when it is re-made on its device (``param_init.materialize_on``,
``fsdp_units``: they copy the parameter's ``__dict__``). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class ParamRole:
    sequence_parallel: bool = False
    """Used on a sequence shard only, so its gradient is partial over tp (or a 2D row):
    summed there (Note [sequence-parallel gradients] in parallel/tensor/sp_columns.py)."""
    tensor_parallel: bool = False
    """Its tp ranks hold different elements: norms sum it over tp."""
    tp_copies: int | None = None
    """Under 2D tensor parallelism, how many tp ranks hold each of its values (Note [2D
    tensor parallelism] in layers2d.py); None where nothing set it."""
    expert_parallel: bool = False
    """An expert's weight split over the expert-parallel ranks: reduced over edp, not dp (moe.py)."""
    pipeline_duplicate: bool = False
    """A second copy of a parameter another stage holds (a tied head, the second copy of a
    replicated stage: Note [stage replicas] in pipeline_stages.py): counted once in the
    gradient norm, loaded but never saved."""
    pipeline_replica: bool = False
    """A replicated stage's parameter (Note [stage replicas] in pipeline_stages.py): gradients summed
    with the other copy's after backward."""
    tied_across_stages: bool = False
    """One of a tied embedding's two stage copies: its gradient waits for their sum."""
    layer_tp: int | None = None
    """Under per-layer degrees, the tp degree of the layer it belongs to (hetero.py)."""


PLAIN = ParamRole()


def role(param) -> ParamRole:
    """``param``'s role; the plain one where no transform gave it one."""
    return getattr(param, "role", PLAIN)


def assign(param, **changes) -> None:
    """Change some fields of ``param``'s role."""
    param.role = replace(role(param), **changes)
