"""A checked normalized document → ``Spec``; and ``spec_to_dict``, the way back.

Takes: a ``Normalized`` document that passed every check (``dsl/validate.py``).
Gives: the ``Spec`` of ``dsl/spec.py`` with defaults filled in (``dsl/presets.py``
for the mesh), ``auto`` as None, and ``Spec.spans`` listing every key that was
written (in the file or by ``--set``), and ``parallel`` itself when it is ``auto``.
The ways back: ``spec_document`` gives the normalized document of a Spec, every value
spelled out (the JSON spec format ``parc check`` reads and ``parc build --emit spec``
prints; loading it gives the same Spec); ``spec_to_dict`` a JSON-able view of the
Spec's fields (enums as their values), used for hashing.
"""

from __future__ import annotations

import dataclasses
import enum

from parc.runtime.layout import constraints
from parc.runtime.layout.layer_settings import SETTINGS, setting

from . import parallel_fields
from .keys import MOE_KEYS
from .normalize import Normalized, dotted
from .presets import PRESETS
from .spec import (
    Arch,
    DataKind,
    DataSpec,
    DecayShape,
    Kernels,
    LrScheduleKind,
    LrScheduleSpec,
    MeshSpec,
    ModelSpec,
    OptimizerSpec,
    ParallelSpec,
    Precision,
    Recompute,
    Spec,
    TrainSpec,
)


def _auto(value):
    return None if value == "auto" else value


def _per_layer(value, read):
    """A key that may hold one value per layer (Note [per-layer values]): None (auto),
    ``read(value)``, or a tuple of ``read(item)``."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(read(item) for item in value)
    return read(value)


def _float(value) -> float | None:
    return None if value is None else float(value)


def _capacity(value) -> float | None:
    return None if value == "none" else float(value)


def build_spec(norm: Normalized, source: str) -> Spec:
    doc = norm.doc
    model, mesh, train = doc["model"], doc["mesh"], doc["train"]
    parallel = doc["parallel"]
    if parallel == "auto":
        parallel = {}
        auto_all = True
    else:
        auto_all = False
    arch = Arch(model["arch"])
    model_spec = ModelSpec.of(
        name=model["name"],
        arch=arch,
        layers=model["layers"],
        hidden=model["hidden"],
        heads=model["heads"],
        kv_heads=model.get("kv_heads", model["heads"]),
        head_dim=model.get("head_dim"),
        qk_norm=model.get("qk_norm", False),
        attention_bias=model.get("attention_bias", False),
        ffn=model["ffn"],
        vocab=model["vocab"],
        seq_len=model["seq_len"],
        pad_vocab_to=model.get("pad_vocab_to", 128),
        dropout=float(model.get("dropout", 0.0)),
        norm_eps=float(model.get("norm_eps", 1e-5)),
        rope_theta=float(model.get("rope_theta", 10000.0)),
        tie_embeddings=model.get("tie_embeddings", arch is Arch.GPT),
        experts=model.get("experts", 0),
        top_k=model.get("top_k", 2),
        expert_ffn=model.get("expert_ffn"),
        moe_every=model.get("moe_every", 1),
        first_dense_layers=model.get("first_dense_layers", 0),
        shared_experts=model.get("shared_experts", 0),
        router=model.get("router", "softmax"),
        capacity_factor=_capacity(model.get("capacity_factor", "none")),
        aux_loss=float(model.get("aux_loss", 0.01)),
        z_loss=float(model.get("z_loss", 0.0)),
        aux_loss_scope=model.get("aux_loss_scope", "micro_batch"),
        router_bias_update=float(model.get("router_bias_update", 0.0)),
        documents=model.get("documents", "joined"),
        routing_imbalance=float(model.get("routing_imbalance", 1.0)),
    )
    preset = PRESETS[mesh["device"]]
    mesh_spec = MeshSpec(
        nodes=mesh["nodes"],
        devices_per_node=mesh["devices_per_node"],
        device=mesh["device"],
        device_memory=_float(mesh.get("device_memory", preset.memory)),
        device_flops=_float(mesh.get("device_flops", preset.flops)),
        intra_node=float(mesh.get("intra_node", preset.intra_node)),
        inter_node=float(mesh.get("inter_node", preset.inter_node)),
        intra_node_latency=float(mesh.get("intra_node_latency", 5e-6)),
        inter_node_latency=float(mesh.get("inter_node_latency", 10e-6)),
        profile=mesh.get("profile"),
    )

    def degree(key: str, default):
        return None if auto_all else _auto(parallel.get(key, default))

    # Note [heterogeneous layouts]: lists → the coarse split and each block's degrees
    degrees = constraints.layer_degrees({"tp": degree("tp", None), "dp": degree("dp", None)})
    if degrees["layer_tp"] is not None or degrees["layer_dp"] is not None:
        n = len(degrees["layer_tp"] or degrees["layer_dp"])
        tps = degrees["layer_tp"] or (degrees["tp"],) * n
        dps = degrees["layer_dp"] or (degrees["dp"],) * n
        # the same degrees for every block: the scalar program (a wrong length stays, for PAR0250)
        uniform = len(set(zip(tps, dps))) == 1 and len(tps) == len(dps) == model["layers"]
        degrees["layer_tp"], degrees["layer_dp"] = (None, None) if uniform else (tuple(tps), tuple(dps))
    parallel_spec = ParallelSpec(
        dp=degrees["dp"],
        tp=degrees["tp"],
        layer_tp=degrees["layer_tp"],
        layer_dp=degrees["layer_dp"],
        recompute=_per_layer(degree("recompute", "none"), Recompute),
        overlap=_per_layer(degree("overlap", {"kind": "none"}), setting("overlap").read),
        **parallel_fields.read(parallel, auto_all),  # Note [a key is its field]
    )
    optimizer = train.get("optimizer", {"kind": "adamw"})
    lr_schedule = train.get("schedule", {"kind": "cosine"})
    data = train.get("data", {"kind": "synthetic"})
    checkpoint = train.get("checkpoint", {"kind": "none"})
    every = checkpoint["kind"] == "every"
    defaults = OptimizerSpec()
    train_spec = TrainSpec(
        global_batch=train["global_batch"],
        micro_batch=_auto(train["micro_batch"]),
        steps=train["steps"],
        optimizer=OptimizerSpec(
            name=optimizer["kind"],
            lr=float(optimizer.get("lr", defaults.lr)),
            betas=tuple(float(b) for b in optimizer.get("betas", defaults.betas)),
            weight_decay=float(optimizer.get("weight_decay", defaults.weight_decay)),
            eps=float(optimizer.get("eps", defaults.eps)),
        ),
        lr_schedule=LrScheduleSpec(
            kind=LrScheduleKind(lr_schedule["kind"]),
            warmup=lr_schedule.get("warmup", 0),
            min_lr_ratio=float(lr_schedule.get("min_lr_ratio", LrScheduleSpec().min_lr_ratio)),
            decay=lr_schedule.get("decay", 0),
            shape=DecayShape(lr_schedule.get("shape", "linear")),
        ),
        grad_clip=float(train.get("grad_clip", 1.0)),
        precision=Precision(train.get("precision", "fp32")),
        master_weights=train.get("master_weights", "fp32"),
        grad_reduce=train.get("grad_reduce", "fp32"),
        seed=train.get("seed", 1234),
        data=DataSpec(
            kind=DataKind(data["kind"]), path=_strings(data.get("path")), dtype=data.get("dtype", "uint16"),
            val_path=_strings(data.get("val")), weights=_weights(data.get("weights")),
        ),
        eval_every=train.get("eval", {}).get("steps", 0),
        eval_batches=train.get("eval", {}).get("batches", 4) if train.get("eval", {}).get("steps") else 0,
        log_every=train.get("log_every", 1),
        checkpoint_every=checkpoint["steps"] if every else 0,
        checkpoint_dir=checkpoint.get("dir", "checkpoints") if every else None,
        tensorboard_dir=train.get("log", {}).get("dir"),
        init_from=train.get("init", {}).get("dir"),
        on_nonfinite=train.get("on_nonfinite", "stop"),
        kernels=Kernels(train.get("kernels", "compiled")),
    )
    return Spec(
        model=model_spec,
        mesh=mesh_spec,
        parallel=parallel_spec,
        train=train_spec,
        source=source,
        spans=_written(norm),
    )


def _written(norm: Normalized):
    """(dotted key, span) of every key and call argument written, sorted by key."""
    out = {}
    for path, origin in norm.origins.items():
        if len(path) < 2 or not all(isinstance(p, str) and not p.startswith("#") for p in path):
            continue
        if path[-1] == "kind" or not _present(norm.doc, path):
            continue
        out[dotted(path)] = origin.span
    whole = norm.origins.get(("parallel",))
    if norm.doc.get("parallel") == "auto" and whole is not None:
        out["parallel"] = whole.span  # parallel = auto: its keys cite this
    return tuple(sorted(out.items()))


def _present(doc, path: tuple) -> bool:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def model_keys(model: ModelSpec) -> dict:
    """The model block's keys, as written or defaulted, in the block's order: ``name``, then
    ``config``'s fields (Note [one model record]) with ``pad_vocab_to`` for ``padded_vocab``
    and ``expert_ffn`` as written, then the planner's ``routing_imbalance``."""
    keys = {"name": model.name}
    for key, value in _fields(model.config).items():
        if key == "padded_vocab":
            continue
        keys[key] = model.expert_ffn if key == "expert_ffn" else value
        if key == "seq_len":
            keys["pad_vocab_to"] = model.pad_vocab_to
    return keys | {"routing_imbalance": model.routing_imbalance}


def spec_to_dict(spec: Spec) -> dict:
    """A JSON-able view of ``spec``: enums as their values, tuples as lists, no spans."""

    def convert(value):
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, ModelSpec):
            return {key: convert(item) for key, item in model_keys(value).items()}
        if dataclasses.is_dataclass(value):
            return {
                f.name: convert(getattr(value, f.name))
                for f in dataclasses.fields(value)
                if f.name != "spans"
            }
        if isinstance(value, (tuple, list)):
            return [convert(item) for item in value]
        return value

    return convert(spec)


def spec_document(spec: Spec) -> dict:
    """The normalized document of ``spec`` (``dsl/schema.py``), defaults written out:
    ``load`` of it as a ``.json`` file gives ``spec`` back (its spans aside)."""
    model, mesh, parallel, train = spec.model, spec.mesh, spec.parallel, spec.train
    model_doc = {key: _plain(value) for key, value in model_keys(model).items()}
    if model.head_dim * model.heads == model.hidden:
        del model_doc["head_dim"]  # = hidden / heads
    for key in ("qk_norm", "attention_bias"):
        if not model_doc[key]:
            del model_doc[key]
    if not model.experts:  # a dense model: the mixture-of-experts keys say nothing
        for key in MOE_KEYS:
            del model_doc[key.name]
    elif model.expert_ffn is None:
        del model_doc["expert_ffn"]  # = ffn
    if model.experts:
        model_doc["capacity_factor"] = "none" if model.capacity_factor is None else model.capacity_factor
    mesh_doc = {k: v for k, v in _fields(mesh).items() if v is not None}

    def auto(value):
        return "auto" if value is None else value

    parallel_doc = {
        "dp": list(parallel.layer_dp) if parallel.layer_dp else auto(parallel.dp),
        "tp": list(parallel.layer_tp) if parallel.layer_tp else auto(parallel.tp),
        **parallel_fields.document(parallel),  # Note [a key is its field]
        **{entry.name: _per_layer_doc(parallel.setting(entry.name), entry.write) for entry in SETTINGS},
    }
    lr = train.lr_schedule
    optimizer = train.optimizer
    train_doc = {
        "global_batch": train.global_batch,
        "micro_batch": auto(train.micro_batch),
        "steps": train.steps,
        "optimizer": {"kind": optimizer.name, "lr": optimizer.lr, "betas": list(optimizer.betas),
                      "weight_decay": optimizer.weight_decay, "eps": optimizer.eps},
        "schedule": {"kind": lr.kind.value, "warmup": lr.warmup}
        | ({} if lr.kind is LrScheduleKind.CONSTANT else {"min_lr_ratio": lr.min_lr_ratio})
        | ({"decay": lr.decay, "shape": lr.shape.value} if lr.kind is LrScheduleKind.WSD else {}),
        "grad_clip": train.grad_clip,
        "precision": train.precision.value,
        "master_weights": train.master_weights,
        "grad_reduce": train.grad_reduce,
        "seed": train.seed,
        "data": {"kind": "synthetic"} if train.data.kind is DataKind.SYNTHETIC
        else {"kind": "tokens", "path": _listed(train.data.path), "dtype": train.data.dtype}
        | ({} if train.data.val_path is None else {"val": _listed(train.data.val_path)})
        | ({"weights": list(train.data.weights)} if train.data.weights else {}),
        "eval": {"kind": "none"} if not train.eval_every
        else {"kind": "every", "steps": train.eval_every, "batches": train.eval_batches},
        "log_every": train.log_every,
        "checkpoint": {"kind": "none"} if not train.checkpoint_every
        else {"kind": "every", "steps": train.checkpoint_every, "dir": train.checkpoint_dir},
        "log": {"kind": "stdout"} if train.tensorboard_dir is None
        else {"kind": "tensorboard", "dir": train.tensorboard_dir},
        "init": {"kind": "none"} if train.init_from is None else {"kind": "checkpoint", "dir": train.init_from},
        "on_nonfinite": train.on_nonfinite,
        "kernels": train.kernels.value,
    }
    return {"model": model_doc, "mesh": mesh_doc, "parallel": parallel_doc, "train": train_doc}


def _fields(value) -> dict:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def _per_layer_doc(value, one):
    """A per-layer key's value: ``auto``, one value, or a list of one per block."""
    if value is None:
        return "auto"
    return [one(item) for item in value] if isinstance(value, tuple) else one(value)


def _strings(value):
    """A path as written, or a blend's list of them as a tuple."""
    return tuple(value) if isinstance(value, list) else value


def _weights(value) -> tuple[float, ...]:
    if value is None:
        return ()
    return tuple(float(w) for w in (value if isinstance(value, list) else [value]))


def _listed(value):
    return list(value) if isinstance(value, tuple) else value
