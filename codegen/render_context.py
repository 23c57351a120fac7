"""train.py's lines for context parallelism (runtime/parallel/context/): the cp group and the
group that averages gradients and the loss over dp × cp, the kind's constant, the arguments
that keep a rank's tokens of each sequence.

Takes: a ``Plan``. Gives: ``constants``, ``CHUNK_ARGS`` and ``adds(plan)``, the
context-parallel entry's sections (``features.Feature.adds``). Before: ``passes/``. After: ``render.py`` gathers the sections.
"""

from __future__ import annotations

from .plan import Plan
from .plan_text import cite
from .view import constant

CP_KIND_WORDS = {
    "ring": "ring attention: K/V blocks passed around cp, load-balanced chunks",
    "ulysses": "all-to-all from sequence to head shards around attention",
    "allgather": "K/V all-gathered over cp, queries stay local",
}
"""``parallel.cp_kind``'s words, the comment of its constant."""

CHUNK_ARGS = (("cp_rank", 'grid.index("cp")'), ("cp_size", "CP"), ("cp_kind", "CP_KIND"))
"""``data.context_chunk``'s keyword arguments (and the evaluator's): which of a sequence's tokens this rank keeps."""


def constants(plan: Plan) -> list[str]:
    """``CP_KIND``, after ``CP`` (render_constants.py)."""
    kind = plan.mesh.cp_kind
    return [constant(kind.name, kind.value, f"{cite(kind.span)}: {CP_KIND_WORDS[kind.value]}")]


def adds(plan: Plan) -> dict:
    return {"groups": [
        'cp_group = grid.group("cp")  # ranks that split each sequence',
        'grad_group = grid.group("dp", "cp")  # ranks that average gradients and the loss',
    ]}
