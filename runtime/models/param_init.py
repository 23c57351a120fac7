"""Initial values of parameters: each rank generates only its shard, keyed by element.

Takes: a freshly built model (``model.py``) whose sharded layers know their full
shape, and the seed. Gives: ``materialize_on(model, seed, device)``; ``fill_``, any box
or flat range of one parameter's initial value; ``boxes`` and ``pieces``, where each
shard sits. (The tests' CPU reference, ``initialize``/``init_values``/``full_init``, is
tests/runtime/init_reference.py.)

Note [counter-based init]: the initial value of element i (row-major index in the
full, unsharded tensor) of parameter ``name`` is a pure function of (seed, name, i):
two 32-bit keys come from crc32 of the seed and name, i is hashed with them (three
rounds of the ``lowbias32`` integer mixer, in int64 torch ops, vectorised) into two
uniform 32-bit words u1, u2, and Box–Muller turns them into one normal value
√(−2 ln u1)·cos(2π u2) (float64, rounded once to float32). So a rank generates
exactly the elements it keeps — the rows of a column-parallel shard, the columns of a
row-parallel one, its experts (``boxes``: where each module's shard sits) — never the
full tensor, and every layout starts from the numbers one rank would, bit for bit; a
parameter's value does not depend on which others exist, in what order they are
built, nor on how it is split. Temporaries are bounded by ``CHUNK`` elements. ``fill_``
also takes a flat range of a box (``start``): under ZeRO-3 the model is built on the
meta device and each rank generates only its slice of each flat buffer
(``fsdp_units.fill_flat_``, called by its ``Unit``). Without ZeRO-3, a model for a CUDA device is built on
the meta device too and ``materialize_on`` allocates each parameter on the device and
generates its shard there (no CPU copy, no torch default init first); on the CPU it is
built and filled in place (the tests' ``initialize``). Both give the same numbers, bit for bit
(tests/runtime/test_param_init.py runs the device path on the CPU; not yet run on a GPU). (float64 ``log``/``cos`` may differ by one float64 ulp between ATen's vector and
scalar paths; that changes the float32 result with probability ~2⁻²⁹ per element,
never seen on the tiny models, which the tests compare bit for bit.)

The rules (the one place they live, ``_rule``): GPT-2 style normal(0, 0.02), residual
projections (o_proj, down_proj) scaled by 1/√(2·layers), norm weights 1, biases 0.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn

from ..checkpoints.checkpoint_shards import _shard_offsets

MASK = 0xFFFFFFFF
CHUNK = 1 << 15
"""Elements generated per vectorised pass on the CPU (bounds the int64/float64 temporaries)."""
CHUNK_CUDA = 1 << 22
"""On CUDA: larger passes, so the ~70 kernels of a pass are not launch-bound (an H200,
45 M elements: 22.8 ns per element at ``CHUNK``, 2.7 at this; ~330 MB of temporaries;
the values were bit-identical to the CPU's, bench/init_cuda_check.py)."""


def _rule(name: str, layers: int) -> tuple[str, float]:
    """("zeros" | "ones" | "normal", std) for parameter ``name``."""
    if name.endswith(".bias"):
        return "zeros", 0.0
    if name.endswith("norm.weight"):
        return "ones", 0.0
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return "normal", 0.02 / math.sqrt(2 * layers)  # GPT-2's scaled residual projections
    return "normal", 0.02


def _keys(seed: int, name: str) -> tuple[int, int]:
    """Two 32-bit keys of (seed, name); crc32 is stable across processes, unlike ``hash()``."""
    return zlib.crc32(f"{seed}/{name}".encode()), zlib.crc32(f"{name}/{seed}".encode()) ^ 0x9E3779B9


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """x·m mod 2³² for x < 2³², as int64 products that never overflow (m split in halves)."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijective 32-bit mixer (every input bit flips ~half the output bits)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _normal_at(index: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """Standard normal float64 values of global element indices ``index`` (int64)."""
    k0, k1 = keys
    h1 = _mix(_mix((index & MASK) ^ k0) ^ (index >> 32) ^ k1)
    h2 = _mix(h1 ^ 0x68E31DA4)
    u1 = (h1.double() + 0.5) * 2.0**-32  # in (0, 1): the log is finite
    u2 = h2.double() * 2.0**-32
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


def _global_index(local: torch.Tensor, full_shape, offsets, shape) -> torch.Tensor:
    """Row-major indices in the full tensor of row-major positions ``local`` of the box."""
    index = torch.zeros_like(local)
    rest, stride = local, 1
    for dim in reversed(range(len(full_shape))):
        coord = rest % shape[dim] + offsets[dim]
        rest = rest // shape[dim]
        index += coord * stride
        stride *= full_shape[dim]
    return index


def fill_(out: torch.Tensor, name: str, full_shape, *, layers: int, seed: int, offsets=None, shape=None,
          start: int = 0) -> torch.Tensor:
    """Write into 1-D-viewable ``out`` the elements [start, start + out.numel()) (row-major)
    of the box ``offsets``/``shape`` (default: the whole tensor) of parameter ``name``'s
    initial value (Note [counter-based init])."""
    full_shape = tuple(int(s) for s in full_shape)
    shape = full_shape if shape is None else tuple(int(s) for s in shape)
    offsets = (0,) * len(full_shape) if offsets is None else tuple(int(o) for o in offsets)
    if len(shape) != len(full_shape) or any(o + s > f for o, s, f in zip(offsets, shape, full_shape)):
        raise ValueError(f"box {offsets}+{shape} is outside {name} of shape {full_shape}")
    flat = out.view(-1)
    if start < 0 or start + flat.numel() > math.prod(shape):
        raise ValueError(f"elements [{start}, {start + flat.numel()}) are outside the box {shape} of {name}")
    kind, std = _rule(name, layers)
    if kind != "normal":
        return flat.fill_(0.0 if kind == "zeros" else 1.0)
    keys = _keys(seed, name)
    chunk = CHUNK_CUDA if out.device.type == "cuda" else CHUNK
    for at in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - at)
        local = torch.arange(start + at, start + at + n, dtype=torch.int64, device=out.device)
        values = _normal_at(_global_index(local, full_shape, offsets, shape), keys)
        flat[at : at + n].copy_(values.mul_(std))
    return out


def boxes(model: nn.Module, tp_group=None):
    """(module, attr, name, full_shape, offsets) of every parameter ``fill_`` sets:
    where each layout's shard sits in the full tensor, as the sharded modules decide it
    (tensor parallel: ``_shard_offsets`` over tp; experts: ``shard_offsets``)."""
    tp_group = getattr(model, "tp_group", tp_group)
    for module_name, module in model.named_modules():
        own = getattr(module, "boxes", None)  # a layer that says where each parameter sits (layers2d.py)
        if own is not None:
            name = getattr(module, "init_name", module_name)
            for attr, (full, offsets) in own.items():
                yield module, attr, f"{name}.{attr}" if name else attr, tuple(full), tuple(offsets)
            continue
        full = getattr(module, "full_shape", None)
        if full is None and isinstance(module, (nn.Linear, nn.Embedding)):
            full = tuple(module.weight.shape)  # a replicated layer
        if full is None:
            continue  # norms are built at 1 (weight) and 0 (bias)
        # A stage's copy of a tied table is drawn as the table it copies (pipeline_stages.py,
        # Note [tied embeddings across stages]).
        name = getattr(module, "init_name", module_name)
        prefix = f"{name}." if name else ""
        weight = module.weight
        group = getattr(module, "tp_group", tp_group)  # a layer's own tp degree (hetero.py)
        offsets = getattr(module, "shard_offsets", None) or _shard_offsets(
            prefix + "weight", tuple(weight.shape), tuple(full), group)
        yield module, "weight", prefix + "weight", tuple(full), offsets
        if getattr(module, "bias", None) is not None:
            bias_full = (full[0],)
            yield module, "bias", prefix + "bias", bias_full, _shard_offsets(
                prefix + "bias", tuple(module.bias.shape), bias_full, group)


def pieces(model: nn.Module) -> dict[int, tuple]:
    """id(parameter) -> (name, full_shape, offsets, shape) for every parameter of
    ``model`` (a model built on the meta device: ZeRO-3 generates its slices from
    these); parameters ``boxes`` leaves out (norms) are whole, replicated tensors."""
    out = {}
    for module, attr, name, full, offsets in boxes(model):
        param = getattr(module, attr)
        out.setdefault(id(param), (name, full, offsets, tuple(param.shape)))
    for name, param in model.named_parameters():
        out.setdefault(id(param), (name, tuple(param.shape), (0,) * param.dim(), tuple(param.shape)))
    return out


@torch.no_grad()
def materialize_on(model: nn.Module, seed: int, device) -> None:
    """A model built on the meta device: every parameter allocated on ``device`` (the
    same new tensor in every module holding it: ties kept; tags such as
    ``tensor_parallel`` copied) and generated there, each rank its shard only
    (Note [counter-based init]); norms get their 1s and 0s from ``_rule``."""
    found, layers, replaced = pieces(model), model.config.layers, {}
    for module in model.modules():
        for attr, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in replaced:
                new = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device),
                                   requires_grad=param.requires_grad)
                new.__dict__.update(param.__dict__)
                name, full, offsets, shape = found[id(param)]
                fill_(new, name, full, layers=layers, seed=seed, offsets=offsets, shape=shape)
                replaced[id(param)] = new
            module._parameters[attr] = replaced[id(param)]
