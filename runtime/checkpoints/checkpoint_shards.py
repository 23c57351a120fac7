"""Where this rank's tensors sit in the logical (unsharded) model, for checkpoints.

Takes: the model of this rank (one ``Transformer`` or the pipeline's ``nn.ModuleList``
of stage chunks), its optimizer (``torch.optim.AdamW`` or ``zero.ShardedAdamW``) and
the tp group. Gives: ``Piece`` lists — each a view of local memory holding one box
``[offsets, offsets + shape)`` of a logical tensor of ``full_shape`` — for the model
(``model.<name>``) and the AdamW moments (``optim.<name>.exp_avg`` /
``.exp_avg_sq``). ``checkpoint.py`` hands them to torch.distributed.checkpoint, which
stores boxes and, on load, reads whatever boxes another layout asks for.

Note [logical checkpoint tensors]: a checkpoint holds each parameter once, under its
global name (``layers.3.attn.q_proj.weight``, the same in every layout) and its full
shape. The embedding and an untied head are stored with their *padded* vocab rows
(``PADDED_VOCAB``, as the model holds them; the padding rows stay at their initial
values and never reach the loss), so any tp degree dividing the padded vocab reads
them; ``parc export`` drops the padding. A tensor-parallel shard is the box at
``tp_rank · local`` along its split dim. A pipeline stage's copy of a tied embedding
(``pipeline_duplicate``, Note [tied embeddings across stages] in pipeline_stages.py) is not
saved: it loads from ``embed.weight``, moments included (its gradient always equals
the table's). Under ZeRO each dp rank owns a slice of one flat buffer that crosses
parameter boundaries (Note [one flat buffer] in zero.py); the part of the slice inside
one parameter is a contiguous run of its row-major elements, stored as up to three
boxes (a partial row, whole rows, a partial row), so the moments are per parameter
and a layout without ZeRO (or with another dp) reads them. ZeRO-3 (fsdp.py) is the same
per unit, and the parameters themselves are read from and written to the shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..distributed.comm import group_rank, group_size
from ..layout.roles import role

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True, slots=True)
class Piece:
    name: str
    """The logical tensor: ``model.embed.weight``, ``optim.layers.0.mlp.up_proj.weight.exp_avg``."""
    full_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    tensor: torch.Tensor
    """A view of this rank's memory: reading a checkpoint writes into it."""


@dataclass(frozen=True, slots=True)
class LocalParameter:
    name: str
    """Logical name; a tied copy carries the name of the table it copies."""
    param: nn.Parameter
    full_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    """Where this rank's shard starts in the full tensor."""
    duplicate: bool
    """A pipeline stage's copy of the tied embedding: loaded, never saved."""


def _chunks(model) -> list[nn.Module]:
    return list(model) if isinstance(model, nn.ModuleList) else [model]


def _shard_offsets(name, local, full, tp_group) -> tuple[int, ...]:
    split = [d for d in range(len(full)) if local[d] != full[d]]
    if not split:
        return (0,) * len(full)
    tp = group_size(tp_group)
    dim = split[0]
    if len(split) > 1 or len(local) != len(full) or local[dim] * tp != full[dim]:
        raise RuntimeError(f"internal error in parc (checkpoint): {name} has shard {local} of {full} over tp {tp}")
    offsets = [0] * len(full)
    offsets[dim] = group_rank(tp_group) * local[dim]
    return tuple(offsets)


def local_parameters(model, tp_group) -> list[LocalParameter]:
    """Every parameter of this rank with its logical name, full shape and shard offsets."""
    out, seen = [], set()
    for chunk in _chunks(model):
        for module_name, module in chunk.named_modules():
            for attr, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                base = getattr(module, "init_name", module_name)
                name = f"{base}.{attr}" if base else attr
                full = getattr(module, "full_shape", None)
                own = getattr(module, "boxes", {}).get(attr)  # Note [2D tensor parallelism] (layers2d.py)
                if own is not None:
                    full = own[0]
                elif full is None:
                    full = tuple(param.shape)
                elif attr == "bias":
                    full = (full[0],)
                full = tuple(int(s) for s in full)
                out.append(
                    LocalParameter(
                        name=name, param=param, full_shape=full,
                        # a module that knows where its shard starts says so (moe.GroupedLinear: its experts)
                        offsets=(None if own is None else tuple(own[1])) or getattr(module, "shard_offsets", None)
                        # a layer's own tp group (Note [heterogeneous layouts]), else the model's
                        or _shard_offsets(name, tuple(param.shape), full, getattr(module, "tp_group", tp_group)),
                        duplicate=bool(role(param).pipeline_duplicate),
                    )
                )
    return out


def stored(optimizer, param):
    """The tensor a checkpoint holds for ``param``: its fp32 master under bf16/fp16
    compute weights (master.py's ``master_of``; Note [master weights]), else the parameter."""
    masters = getattr(optimizer, "master_of", None)
    return param if masters is None else masters[id(param)]


def model_pieces(params: list[LocalParameter], *, saving: bool, optimizer=None) -> list[Piece]:
    """The parameters' boxes (their fp32 masters under bf16/fp16: ``stored``); under ZeRO
    ``checkpoint_flat.model_pieces``."""
    return [
        Piece(f"model.{p.name}", p.full_shape, p.offsets, stored(optimizer, p.param).detach())
        for p in params
        if not (saving and p.duplicate)
    ]


def buffer_pieces(model) -> list[Piece]:
    """The model's persistent buffers (the MoE router biases, Note [auxiliary-loss-free
    balancing] in router_bias.py), each whole: every rank holding one holds the same values."""
    out = []
    for chunk in _chunks(model):
        for module_name, module in chunk.named_modules():
            base = getattr(module, "init_name", module_name)
            for attr, buffer in module._buffers.items():
                if buffer is not None and attr not in module._non_persistent_buffers_set:
                    name = f"model.{base}.{attr}" if base else f"model.{attr}"
                    out.append(Piece(name, tuple(buffer.shape), (0,) * buffer.dim(), buffer))
    return out


def loaded(optimizer) -> None:
    """After a load into the fp32 masters (``stored``, ``master_shards``): the compute
    weights get their rounded values (under ZeRO ``checkpoint_flat.loaded``)."""
    if getattr(optimizer, "master_of", None) is not None:
        optimizer.copy_to_model()


def is_zero(optimizer) -> bool:
    """ZeRO (any stage): the optimizer holds this rank's slices in one flat buffer ``flat``,
    or in several (``parts``: hetero.ShardedAdamW, one per layer layout)."""
    return hasattr(optimizer, "flat") or hasattr(optimizer, "parts")


def optimizer_pieces(params: list[LocalParameter], optimizer, *, saving: bool) -> list[Piece]:
    """The AdamW moments of this rank as logical boxes (``prepare_state`` first when
    loading); under ZeRO ``checkpoint_flat.optimizer_pieces``."""
    pieces = []
    for info in params:
        if saving and info.duplicate:
            continue
        state = optimizer.state.get(stored(optimizer, info.param))
        if not state:
            continue  # never stepped (no gradient yet)
        for moment in MOMENTS:
            pieces.append(Piece(f"optim.{info.name}.{moment}", info.full_shape, info.offsets, state[moment]))
    return pieces


def optimizer_step(optimizer) -> int:
    """AdamW's step count (the bias correction's t), which skipped steps do not advance;
    under ZeRO ``checkpoint_flat.optimizer_step``."""
    for state in optimizer.state.values():
        return int(state["step"])
    return 0


@torch.no_grad()
def prepare_state(optimizer, step: int) -> None:
    """Give a fresh optimizer the state a checkpoint's moments are read into; under ZeRO
    ``checkpoint_flat.prepare_state``."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            optimizer.state[param] = {
                "step": torch.tensor(float(step), dtype=torch.float32),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }
