"""The parts of a model description: a parameter, a module, a count of parameters.

Takes: nothing (a leaf module, plain Python, no torch). Gives: the module layers
(``LINEAR``, ``EMBEDDING``, ``NORM``, ``GROUPED``), ``ParamDesc``, ``ModuleDesc`` and
``ParamCount`` (``NONE``: zero). model_desc.py builds the description of a model from
them (and gives them as its own); the modules it imports only for some models or for
the planner (expert_desc.py, model_counts.py) import them from here, never
model_desc.py back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LINEAR, EMBEDDING, NORM, GROUPED = "linear", "embedding", "norm", "grouped_linear"
"""Module layers; ``grouped_linear``: E experts' weights as one (E, out, in) tensor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamDesc:
    name: str
    """``weight`` or ``bias``."""
    shape: tuple[int, ...]
    """The whole tensor's shape."""
    split_dim: int | None = None
    """The dim tp splits when the module is sharded; None: whole on every tp rank."""
    sequence_parallel: bool = False
    """Replicated, but sees only a sequence shard under sp: its gradient is partial
    (runtime/parallel/tensor/sp_columns.py, Note [sequence-parallel gradients])."""

    def local_shape(self, tp: int = 1) -> tuple[int, ...]:
        """The shard one rank holds when the module is split over ``tp`` ranks."""
        return tuple(n // tp if d == self.split_dim else n for d, n in enumerate(self.shape))

    def numel(self, tp: int = 1) -> int:
        return math.prod(self.local_shape(tp))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleDesc:
    name: str
    """As the runtime names it: ``embed``, ``layers.3.attn.q_proj``, ``head``."""
    kind: str
    """The name without its layer prefix (``attn.q_proj``); the TP table's word for it."""
    layer: str
    """``linear``, ``embedding``, ``norm`` or ``grouped_linear`` (experts)."""
    style: str | None
    """How tp splits it when it is sharded (``colwise``, ``rowwise``, ``vocab``,
    ``vocab_head``: runtime/parallel/tensor/tp_plan.py); None: always replicated."""
    params: tuple[ParamDesc, ...]
    tied_to: str | None = None
    """The module whose weight this one is (the tied head: ``embed``), or None."""

    @property
    def pattern(self) -> str:
        """The name with ``*`` for the layer index, as train.py's ``TP_PLAN`` writes it."""
        return "layers.*." + self.kind if self.name.startswith("layers.") else self.name

    @property
    def weight(self) -> ParamDesc:
        return self.params[0]

    def numel(self, tp: int = 1) -> int:
        """Elements on one rank when the module is split over ``tp`` ranks (1: whole)."""
        return sum(p.numel(tp) for p in self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCount:
    elements: int
    tensors: int

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(elements=self.elements + other.elements, tensors=self.tensors + other.tensors)

    def __sub__(self, other: ParamCount) -> ParamCount:
        return ParamCount(elements=self.elements - other.elements, tensors=self.tensors - other.tensors)


NONE = ParamCount(elements=0, tensors=0)
