"""2D tensor parallelism: every weight split over an R × C grid of the tp ranks.

Takes: a ``TensorGrid`` (``mesh.Mesh.tp_grid``: this rank's row and column index and the
process groups along the two sides of the grid). Gives: the layers ``model.py`` builds
under ``tp_shape = (R, C)`` with R > 1 — ``Linear2D`` (the colwise and rowwise styles of
the TP plan), ``Embedding2D``, ``Norm2D``, ``LMHead2D`` — each with ``boxes``: where its
parameters sit in the full tensors (initialization and checkpoints read them, so a 2D
model starts from, and saves, the same logical tensors as one rank).

Note [2D tensor parallelism]: ATP's 2D matmul on a grid of R rows × C columns (tp rank
t = r·C + c, so a row's C ranks are consecutive: the fast links; a column's R ranks
stride C apart: the slow ones). Between blocks the hidden state is split along its
features over the column group (r picks the slice, (B, T, hidden/R)) and replicated
along a row. A colwise linear (q/k/v, up/gate, the head: in → out) holds the block
W[out/C at c, in/R at r]: each rank multiplies its feature slice, and the partial
products are all-reduced over the column group (the R ranks of column c), leaving out/C
features replicated over R; its input's gradient is all-reduced over the row group in
backward. A rowwise linear (o_proj, down_proj) holds W[out/R at r, in/C at c]: it reads
those out/C features and all-reduces over the row group, giving back (B, T, hidden/R).
So each linear pays one all-reduce forward and one backward, of (B, T, out/C) over R
ranks or (B, T, hidden/R) over C ranks, instead of 1D's (B, T, hidden) over all tp.
Norms over the hidden/R slice sum their statistics over the column group; attention
runs on heads/C heads, the same on the R ranks of a column (the price of the scheme:
R copies of the attention core; the cost model counts it). The embedding table is
split [vocab/C, hidden/R] (lookups summed over the row group); the head is a colwise
linear whose logits (B, T, vocab/C) go to the vocab-parallel loss over the row group.

Note [2D sequence parallelism]: with ``sp = true`` the hidden state between blocks is
also split along the sequence over the row group: rank (r, c) holds (B, T/C, hidden/R),
1/(R·C) of it, so norms, dropout and the residual adds run on 1/(R·C) of the
activations. It is Megatron's sequence parallelism moved onto the row: the rowwise
linears (and the embedding) reduce-scatter their partial sums along T over the row group
instead of all-reducing them, and the colwise linears (and the head) all-gather their
input along T over the row group (backward: a reduce-scatter of its gradient, which is
the sum over the row that the plain scheme all-reduces). The column group's R ranks share
c, so they hold the same tokens and the norms' statistics still sum over the column. The
parameters used on a sequence shard only — norms, rowwise biases, GPT's positions — get
partial gradients, tagged ``sequence_parallel`` and summed over the row group
(``model.allreduce_sequence_parallel_grads(net, tp_grid.row_group)``). seq_len must
divide by C (``constraints.sequence_parallel``); with C = 1 nothing is split along T.

Gradient norms: a parameter replicated along one side of the grid carries
``tp_copies`` (how many tp ranks hold the same values); ``optim.clip_grad_norm_``
divides its squares by that before summing over tp, so each value counts once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...distributed.comm import copy_to_group, group_size, reduce_from_group
from ...distributed.comm_scatter import all_gather_from_group, reduce_scatter_to_group
from ...layout.axes import TP_SIDES, coordinates, partition
from ...layout.roles import assign, role
from .layers import vocab_parallel_cross_entropy


@dataclass(frozen=True)
class TensorGrid:
    """This rank's place on the R × C tensor-parallel grid (Note [2D tensor parallelism])."""

    rows: int
    """R: the ranks of a column (strided C apart: the slow side when tp spans nodes)."""
    cols: int
    """C: the ranks of a row (consecutive ranks)."""
    row: int
    """r: this rank's row, the hidden slice it holds between blocks."""
    col: int
    """c: this rank's column, the output slice of its colwise linears."""
    column_group: object = None
    """The R ranks of column c (``mesh`` axis ``tpr``); None when R = 1."""
    row_group: object = None
    """The C ranks of row r (``mesh`` axis ``tpc``); None when C = 1."""


def split_tp(axes: tuple[tuple[str, int], ...], tp_shape) -> tuple[tuple[str, int], ...]:
    """``axes`` with ``("tp", R·C)`` read as ``("tpr", R), ("tpc", C)`` (Note [2D tensor parallelism])."""
    rows, cols = (int(n) for n in tp_shape)
    out = []
    for name, size in axes:
        if name != "tp":
            out.append((name, size))
            continue
        if rows * cols != size:
            raise ValueError(f"tp_shape = ({rows}, {cols}) does not arrange tp = {size} ranks")
        out += [(TP_SIDES[0].name, rows), (TP_SIDES[1].name, cols)]
    return tuple(out)


def tensor_grid(mesh, tp_shape) -> TensorGrid:
    """``mesh.Mesh.tp_grid``'s grid: this rank's place on the ``tp_shape`` = R × C grid of
    its tp ranks, and a process group along each side (``axes.TP_SIDES``) with more than one rank."""
    rows, cols = (int(n) for n in tp_shape)
    fine = split_tp(mesh.axes, (rows, cols))
    groups = {}
    for side in TP_SIDES:
        groups[side.name] = None
        if dict(fine)[side.name] > 1:
            for ranks in partition(fine, (side.name,)):
                group = dist.new_group(list(ranks))
                if mesh.rank in ranks:
                    groups[side.name] = group
    coords = coordinates(mesh.rank, fine)
    return TensorGrid(rows=rows, cols=cols, row=coords["tpr"], col=coords["tpc"],
                      column_group=groups["tpr"], row_group=groups["tpc"])


def _piece(full: int, parts: int, index: int, what: str) -> tuple[int, int]:
    """(offset, size) of slice ``index`` of ``full`` cut in ``parts``."""
    if full % parts:
        raise ValueError(f"{what} = {full} does not split over {parts} ranks of the tp grid")
    size = full // parts
    return index * size, size


def _tag(param, copies: int, sequence_parallel: bool = False) -> None:
    """Sharded over tp, each value held by ``copies`` tp ranks (Note [2D tensor parallelism]);
    ``sequence_parallel``: used on a sequence shard only (Note [2D sequence parallelism])."""
    assign(param, tensor_parallel=True, tp_copies=copies)
    if sequence_parallel:
        assign(param, sequence_parallel=True)


def enter_row(x, grid: TensorGrid, sequence_parallel: bool):
    """The stream (B, T/C or T, hidden/R) as a colwise product reads it, (B, T, hidden/R):
    under sp all-gathered along T over the row (backward: reduce-scatter), else as is
    (backward: its gradient all-reduced over the row)."""
    if sequence_parallel:
        return all_gather_from_group(x, grid.row_group, dim=1)
    return copy_to_group(x, grid.row_group)


def leave_row(y, grid: TensorGrid, sequence_parallel: bool):
    """Partial sums (B, T, features) summed over the row: under sp reduce-scattered along
    T to (B, T/C, features), else all-reduced."""
    if sequence_parallel:
        return reduce_scatter_to_group(y, grid.row_group, dim=1)
    return reduce_from_group(y, grid.row_group)


def grid_loss(model, x, targets):
    """``Transformer.loss``'s per-token loss on the grid: the head is colwise, its logits
    (B, T, V/C) summed over the column, the cross-entropy taken over the row."""
    grid = model.tp_grid
    x = enter_row(x, grid, model.sp)  # (B, T, C/R); under sp gathered over the row (Note [2D sequence parallelism])
    logits = reduce_from_group(F.linear(x, model.head_weight()), grid.column_group)  # (B, T, V/C)
    return vocab_parallel_cross_entropy(
        logits, targets, tp_group=grid.row_group, vocab_size=model.config.vocab, kernels=model.fused
    )


def check_grid_count(model, expected) -> None:
    """``transformer.check_parameter_count`` on the grid: the stage's parameters, each value
    counted once over the grid (``tp_copies``), are ``expected`` (model_desc.py's whole count)."""
    tp, layers = group_size(model.tp_group), model.span
    params = list(model.parameters())
    built = sum(p.numel() * tp // (role(p).tp_copies or tp) for p in params)
    if (built, len(params)) != (expected.elements, expected.tensors):
        raise RuntimeError(
            f"internal error in parc (runtime model): the tp grid {model.tp_grid.rows}×{model.tp_grid.cols} "
            f"holds {built:,} parameters in {len(params)} tensors per rank, but model_desc.py describes "
            f"{expected.elements:,} in {expected.tensors} for layers {layers[0]}..{layers[1]}"
        )


class Linear2D(nn.Module):
    """``colwise``: (B, T, in/R) → (B, T, out/C); ``rowwise``: (B, T, in/C) → (B, T, out/R).

    Forward: the local product, all-reduced over the ranks that hold the other input
    slices; the bias (split like the output) added after the sum. Backward: the input's
    gradient all-reduced over the ranks that hold the other output slices. Under
    ``sequence_parallel`` (Note [2D sequence parallelism]) a colwise one reads (B, T/C,
    in/R) and all-gathers it over the row, a rowwise one gives (B, T/C, out/R).
    """

    def __init__(self, in_features, out_features, *, bias, grid: TensorGrid, style: str, sequence_parallel=False):
        super().__init__()
        self.grid, self.style, self.sequence_parallel = grid, style, bool(sequence_parallel)
        if style not in ("colwise", "rowwise"):
            raise ValueError(f"2D tensor parallelism has no style {style!r}")
        self.full_shape = (out_features, in_features)
        col = style == "colwise"
        # (parts, index) of the output and input features
        out_split = (grid.cols, grid.col) if col else (grid.rows, grid.row)
        in_split = (grid.rows, grid.row) if col else (grid.cols, grid.col)
        self.enter_group = grid.row_group if col else grid.column_group  # input grad summed here
        self.reduce_group = grid.column_group if col else grid.row_group  # partial products summed here
        out_at, out_size = _piece(out_features, *out_split, "out_features")
        in_at, in_size = _piece(in_features, *in_split, "in_features")
        self.weight = nn.Parameter(torch.empty(out_size, in_size))
        self.bias = nn.Parameter(torch.empty(out_size)) if bias else None
        _tag(self.weight, 1)
        if self.bias is not None:  # replicated over the ranks of the other input slices; a rowwise
            _tag(self.bias, in_split[0], self.sequence_parallel and not col)  # one is added on T/C under sp
        self.boxes = {"weight": (self.full_shape, (out_at, in_at))}
        if bias:
            self.boxes["bias"] = ((out_features,), (out_at,))

    @property
    def entry(self):
        """How a colwise linear's input enters (``layers.project``: the q, k, v projections,
        or up and gate, that share it enter it once); None for a rowwise one."""
        return ("2d", self.enter_group, self.sequence_parallel) if self.style == "colwise" else None

    def enter(self, x):
        """A colwise linear's input as the matmul takes it (``enter_row``)."""
        return enter_row(x, self.grid, self.sequence_parallel)

    def local(self, x):
        """The product on an input that already entered, summed over the reducing ranks."""
        if self.style == "colwise":
            y = reduce_from_group(F.linear(x, self.weight), self.reduce_group)  # (B, T, out/C)
        else:
            y = leave_row(F.linear(x, self.weight), self.grid, self.sequence_parallel)  # (B, T or T/C, out/R)
        return y if self.bias is None else y + self.bias

    def forward(self, x):
        if self.style == "colwise":
            return self.local(self.enter(x))
        return self.local(copy_to_group(x, self.enter_group))  # its gradient summed over the column


class Embedding2D(nn.Module):
    """Token ids (B, T) → (B, T, hidden/R): the table split [vocab/C, hidden/R]; each rank
    looks up the ids in its rows (zeros elsewhere) and the row group sums the parts
    (reduce-scattered along T under sp: (B, T/C, hidden/R))."""

    def __init__(self, num_embeddings, dim, *, grid: TensorGrid, sequence_parallel=False):
        super().__init__()
        self.grid, self.sequence_parallel = grid, bool(sequence_parallel)
        self.full_shape = (num_embeddings, dim)
        self.start, self.rows = _piece(num_embeddings, grid.cols, grid.col, "padded_vocab")
        dim_at, dim_size = _piece(dim, grid.rows, grid.row, "hidden")
        self.weight = nn.Parameter(torch.empty(self.rows, dim_size))
        _tag(self.weight, 1)
        self.boxes = {"weight": (self.full_shape, (self.start, dim_at))}

    def forward(self, tokens):
        local = tokens - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return leave_row(out, self.grid, self.sequence_parallel)  # (B, T or T/C, hidden/R)


class Positions2D(nn.Module):
    """GPT's learned positions (seq_len, hidden/R): this rank's feature slice (under sp
    read at this rank's T/C positions only: partial gradients)."""

    def __init__(self, seq_len, dim, *, grid: TensorGrid, sequence_parallel=False):
        super().__init__()
        self.full_shape = (seq_len, dim)
        dim_at, dim_size = _piece(dim, grid.rows, grid.row, "hidden")
        self.weight = nn.Parameter(torch.empty(seq_len, dim_size))
        _tag(self.weight, grid.cols, sequence_parallel)
        self.boxes = {"weight": (self.full_shape, (0, dim_at))}


class Norm2D(nn.Module):
    """LayerNorm (with bias) or RMSNorm over features split over the column group: the
    row statistics are sums over the R ranks of a column (forward and backward). Under sp
    it sees the row's T/C tokens (Note [2D sequence parallelism])."""

    fused = None  # the model's kernel switch; the 2D norm is always eager

    def __init__(self, hidden, *, rms, eps, grid: TensorGrid, sequence_parallel=False):
        super().__init__()
        self.rms, self.eps, self.hidden, self.group = rms, eps, hidden, grid.column_group
        at, size = _piece(hidden, grid.rows, grid.row, "hidden")
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = None if rms else nn.Parameter(torch.zeros(size))
        self.boxes = {}
        for attr, param in self.named_parameters():
            _tag(param, grid.cols, sequence_parallel)
            self.boxes[attr] = ((hidden,), (at,))

    def _row_sum(self, x):
        """Σ over all hidden features of x (B, T, hidden/R) → (B, T, 1), on every rank of the column."""
        return copy_to_group(reduce_from_group(x.sum(dim=-1, keepdim=True), self.group), self.group)

    def forward(self, x):
        if self.rms:
            mean_square = self._row_sum(x * x) / self.hidden
            return x * torch.rsqrt(mean_square + self.eps) * self.weight
        centered = x - self._row_sum(x) / self.hidden
        variance = self._row_sum(centered * centered) / self.hidden
        return centered * torch.rsqrt(variance + self.eps) * self.weight + self.bias

    def add_norm(self, x, residual):
        """(norm(h), h) with h = residual + x, as ``model.Norm.add_norm`` gives: here the add,
        then the eager 2D norm (Note [pending residual] in model.py)."""
        h = residual + x
        return self(h), h
