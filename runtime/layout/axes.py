"""The mesh axes, as data: their names, what each splits, and their order.

Takes: nothing (a leaf module, plain Python, no torch). Gives: ``AXES``, the registry
of axes in mesh order (outermost first), and the mixed-radix arithmetic every part of
parc uses to place ranks on them: ``mesh_axes`` (a layout's degrees in mesh order),
``coordinates`` (a rank's index along each axis) and ``group_ranks`` (the ranks that
differ from a rank only along some axes). The code generator (``parc.runtime.layout.axes``:
``resolve_mesh``, the Plan's ``MeshPlan.ranks``, the renderer) and the generated trainer
(``parc_runtime.mesh``) read the same table, so the plan says exactly which ranks
the program groups together.

Note [adding an axis]: a new parallel dimension (context parallel ``cp`` was one) is one
``Axis`` entry here, at its place in the order, with the spec key that sets its
degree (``parallel.cp``). The mesh, the ranks and groups of the plan, ``MESH_AXES``
in ``train.py`` and ``plan.json`` follow from the table; what the axis *does* to the
model is the business of the layers that use its group (``grid.group("cp")``, or a
group over several axes, ``grid.group("dp", "cp")``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Axis:
    name: str
    """Short name: the spec key under ``parallel``, the constant in train.py upper-cased."""
    splits: str
    """What its ranks divide between them, for generated comments and READMEs."""
    ranks: str
    """What its ranks are called, for the constant's comment (``data-parallel ranks``)."""
    always: bool = False
    """train.py names it (its constant, ``MESH_AXES``) even at size 1; other axes appear
    only when used, their constant set by the feature that uses them (``PP``)."""
    divides: tuple[str, ...] = ()
    """Model sizes its degree must divide (names of ``constraints.KEYS``: heads, ffn, ...)."""
    code: str = "PAR0203"
    """The error code when it does not (``runtime/layout/constraints/``)."""
    in_world: bool = True
    """A factor of the world size (an expert axis refolds a stage's ranks instead)."""

    @property
    def key(self) -> str:
        """The spec key that sets its degree."""
        return f"parallel.{self.name}"


AXES: tuple[Axis, ...] = (
    Axis("pp", "layers into pipeline stages (1: not used)", "pipeline stages", code="PAR0205"),
    Axis("dp", "the batch; gradients are averaged", "data-parallel ranks", always=True),
    Axis("cp", "each sequence (context parallel: ring in 2·cp chunks, rank r holding r and 2·cp−1−r; "
         "ulysses and allgather in contiguous ones)", "context-parallel ranks", code="PAR0220"),
    Axis(
        "tp", "each layer's weights (tensor parallel)", "tensor-parallel ranks", always=True,
        divides=("heads", "ffn", "padded_vocab"),  # kv_heads: constraints.tp_kv_heads (it may replicate them)
    ),
)
"""Mesh order, outermost first: tp innermost, so a tp group is consecutive ranks on one
node (it talks on every layer); cp next to it (attention talks over cp on every layer);
pp outermost, so stages are whole nodes when they can be."""

NAMES: tuple[str, ...] = tuple(axis.name for axis in AXES)

WORLD_ORDER: tuple[str, ...] = ("dp", "cp", "tp", "pp")
"""How messages write the world size (dp·cp·tp·pp); the first is the degree a hint solves for."""


def axis(name: str) -> Axis:
    for entry in AXES:
        if entry.name == name:
            return entry
    raise KeyError(f"no mesh axis {name!r}; the axes are {', '.join(NAMES)}")


def mesh_axes(degrees) -> tuple[tuple[str, int], ...]:
    """``(name, size)`` of every axis in mesh order; ``degrees`` maps names to sizes (missing: 1)."""
    return tuple((name, int(degrees.get(name, 1))) for name in NAMES)


def coordinates(rank: int, axes: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """Mixed-radix digits of ``rank`` over ``axes`` (outermost first, last fastest)."""
    coords = {}
    for name, size in reversed(axes):
        coords[name] = rank % size
        rank //= size
    return {name: coords[name] for name, _ in axes}


def group_ranks(rank: int, axes: tuple[tuple[str, int], ...], names) -> tuple[int, ...]:
    """Global ranks that share every coordinate of ``rank`` except those along ``names``, ascending."""
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in dict(axes)]
    if unknown:
        raise KeyError(f"no mesh axis {unknown[0]!r} in {axes}")
    strides, stride = {}, 1
    for name, size in reversed(axes):
        strides[name] = stride
        stride *= size
    coords = coordinates(rank, axes)
    base = rank - sum(coords[n] * strides[n] for n in names)
    members = [base]
    for name in names:
        members = [m + i * strides[name] for m in members for i in range(dict(axes)[name])]
    return tuple(sorted(members))


def partition(axes: tuple[tuple[str, int], ...], names) -> tuple[tuple[int, ...], ...]:
    """Every group along ``names``, by first rank: the groups partition the world.

    One pass over the ranks (linear in the world size: a mesh of 100,000 ranks is
    planned in the same breath as a small one)."""
    names = (names,) if isinstance(names, str) else tuple(names)
    world = 1
    for _, size in axes:
        world *= size
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(world):
        coords = coordinates(rank, axes)
        key = tuple(index for name, index in coords.items() if name not in names)
        groups.setdefault(key, []).append(rank)
    return tuple(sorted(tuple(group) for group in groups.values()))


TP_SIDES: tuple[Axis, ...] = (
    Axis("tpr", "the tp ranks' rows of the R × C grid (R of them, strided: the slow links)",
         "rows of the tensor-parallel grid", divides=("hidden",)),
    Axis("tpc", "the tp ranks' columns of the R × C grid (C of them, consecutive ranks)",
         "columns of the tensor-parallel grid", divides=("heads", "ffn", "padded_vocab")),  # kv_heads: PAR0278
)
"""Note [2D tensor parallelism] (runtime/parallel/tensor/layers2d.py): on an R × C grid of the tp ranks the tp
axis is read as two sub-axes, ``tpr`` (R, outer) then ``tpc`` (C, inner, the fastest
digit): tp rank t = r·C + c. ``tpr`` groups (the R ranks of one column, strided C apart)
carry the colwise linears' sums; ``tpc`` groups (C consecutive ranks) the rowwise ones.
They refine tp (``layers2d.split_tp``), they add no factor to the world. Their ``divides`` stand in for tp's on a
grid: C splits the heads, the ffn and the vocab (the colwise outputs), R the hidden
features (``constraints.tp_grid_fits``, PAR0203)."""
