"""``parc import HF_DIR -o OUT``: a Hugging Face causal LM as a parc spec and checkpoint.

Takes: a folder as transformers' ``save_pretrained`` writes it — ``config.json`` and
``model.safetensors``, or shards named by ``model.safetensors.index.json`` — of GPT-2,
Llama (Qwen2, Qwen3: Note [Qwen names] in hf_names.py) or Mixtral. Gives: ``OUT/model.par``, a complete spec whose model block is the
config (each value citing the config key it came from), a one-node CPU mesh and a
``train`` block starting from the weights (``init = checkpoint("checkpoint")``); and
``OUT/checkpoint/``, a parc checkpoint (Note [logical checkpoint tensors]) holding the
weights only (``weights_only`` in its parc.json): ``train.py --init-from`` loads it into
any layout, ``parc export`` turns it back into the same tensors.
The names, layouts and config keys are codegen/hf_names.py's (Note [Hugging Face
layouts]), read the other way from ``parc export``.

Note [import streams]: the checkpoint is written by torch.distributed.checkpoint in one
process, with a save planner (``_streaming_planner``) whose tensors are placeholders of
the right shape on the meta device; DCP's writer asks for each tensor's bytes in turn
(``lookup_object``), and only then is it read from the safetensors file (mmapped by
``safe_open``), converted (``parc_tensor``: ``hf_names.from_hf``) and written to a file
of its own (DCP's writer keeps every tensor of a file until the file is closed). So at
most two parc tensors (the one being made, the one DCP wrote last and still holds) and
the Hugging Face tensors of one are in memory, whatever the model's size
(bench/import_memory.py measures it). Every tensor's name and shape is checked before
anything is written; the output is made in ``OUT.parc-tmp`` and renamed into place
last, so a failure leaves nothing.
Tensors are stored as float32 (parc's master weights); a bf16 or fp16 model is widened
exactly, so its export holds the same values in float32.
"""

from __future__ import annotations

import json
import os
import shutil

from parc.codegen import hf_names
from parc.runtime.paths import UnreadableFile, UnsafePath, inside, read_json

CHECKPOINT = "checkpoint"
SPEC = "model.par"


class HfImportError(Exception):
    """A folder parc cannot import; the message names the file and key."""


# ---- config.json -> the model block ---------------------------------------------------


def read_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        config = read_json(inside(folder, "config.json"))
    except (UnreadableFile, UnsafePath) as exc:
        raise HfImportError(f"{path}: {exc}") from None
    if not isinstance(config, dict):
        raise HfImportError(f"{path}: must be an object")
    return config


def _rope(config: dict) -> tuple[float, str]:
    """(theta, the key it came from); a rotary scaling parc lacks is refused naming its key."""
    parameters = config.get("rope_parameters")  # transformers 5
    if isinstance(parameters, dict):
        if parameters.get("rope_type", "default") != "default":
            raise HfImportError(f'"rope_parameters": rope_type {parameters["rope_type"]!r}: parc\'s rotary '
                                "has no scaling (only rope_type \"default\")")
        return parameters.get("rope_theta", config.get("rope_theta")), 'rope_parameters["rope_theta"]'
    scaling = config.get("rope_scaling")  # transformers 4
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if scaling and kind != "default":
        raise HfImportError(f'"rope_scaling" = {json.dumps(scaling)}: parc\'s rotary has no scaling')
    return config.get("rope_theta"), "rope_theta"


def _value(config: dict, hf_key: str):
    if hf_key not in config:
        if hf_key in hf_names.ABSENT:
            return hf_names.ABSENT[hf_key]
        raise HfImportError(f'"{hf_key}" is missing: parc needs it for the model block')
    return config[hf_key]


def parc_model(config: dict) -> tuple[str, list[tuple[str, object, str]]]:
    """(model_type, [(parc model key, value, where it came from)]) of a config.json.

    A config parc cannot hold raises ``HfImportError`` naming its key."""
    kind = config.get("model_type")
    if kind not in hf_names.CONFIG_KEYS:
        raise HfImportError(f'"model_type" = {kind!r}: parc imports {", ".join(sorted(hf_names.CONFIG_KEYS))}')
    for key, value in hf_names.FIXED[kind].items():
        if key in hf_names.NOT_IMPORTED or key not in config or config[key] == value:
            continue
        if key == "architectures" and value[0] in (config[key] or ()):
            continue
        raise HfImportError(f'"{key}" = {json.dumps(config[key])}: parc\'s {kind} has {json.dumps(value)} only')
    rows: dict[str, tuple[object, str]] = {"arch": ("gpt" if kind == "gpt2" else "llama", '"model_type"')}
    for parc_key, hf_key in hf_names.CONFIG_KEYS[kind]:
        if hf_key == "rope_theta":
            value, hf_key = _rope(config)
        else:
            value = _value(config, hf_key)
        value = _defaulted(parc_key, value, rows)
        if parc_key in rows and rows[parc_key][0] != value:
            raise HfImportError(f'"{hf_key}" = {value!r} but {rows[parc_key][1]} = {rows[parc_key][0]!r}: parc has '
                                f"one {parc_key} for both")
        rows.setdefault(parc_key, (_checked(hf_key, value, parc_key), f'"{hf_key}"' if '"' not in hf_key else hf_key))
    _check_shape_keys(kind, config, rows)
    hidden, heads = rows["hidden"][0], rows["heads"][0]
    if "head_dim" in rows and rows["head_dim"][0] * heads == hidden:
        del rows["head_dim"]  # hidden / heads, parc's default: the spec stays as it was
    for key, value in hf_names.TRAITS.get(kind, ()):  # Note [Qwen names]
        rows[key] = (value, f'"model_type" = {json.dumps(kind)}')
    if kind == "mixtral":  # Note [Mixtral's aux loss]: one pooled term → parc's per-layer coefficient
        coef = rows["aux_loss"][0]
        rows["aux_loss"] = (hf_names.aux_loss(coef, rows["layers"][0], rows["top_k"][0]),
                            '"router_aux_loss_coef" · "num_experts_per_tok" / "num_hidden_layers"')
    return kind, [(key, value, words) for key, (value, words) in rows.items()]


def _defaulted(parc_key: str, value, rows: dict):
    """A null in config.json: GPT-2's n_inner is 4·n_embd; a null kv head count is the heads."""
    if value is not None:
        return value
    if parc_key == "ffn":
        return 4 * rows["hidden"][0]
    if parc_key == "kv_heads":
        return rows["heads"][0]
    if parc_key == "head_dim":
        return rows["hidden"][0] // rows["heads"][0]
    return value


VALUE_TYPES = {"tie_embeddings": bool, "dropout": float, "norm_eps": float, "rope_theta": float, "aux_loss": float}


def _checked(hf_key: str, value, parc_key: str):
    kind = VALUE_TYPES.get(parc_key, int)
    fine = isinstance(value, kind) if kind is not float else isinstance(value, (int, float))
    if not fine or (kind is not bool and isinstance(value, bool)):
        raise HfImportError(f'"{hf_key}" = {json.dumps(value)}: must be {kind.__name__}')
    return float(value) if kind is float else value


def _check_shape_keys(kind: str, config: dict, rows: dict) -> None:
    window = config.get("sliding_window")
    if kind == "mixtral" and window is not None and window < rows["seq_len"][0]:
        raise HfImportError(f'"sliding_window" = {window}: parc attends to the whole sequence '
                            f'(max_position_embeddings = {rows["seq_len"][0]})')


# ---- the spec ---------------------------------------------------------------------------

TRAIN_BLOCK = """\
mesh {
  nodes = 1
  devices_per_node = 1
  device = cpu  # one CPU process; set the mesh and parallel blocks for your machines
}

parallel {
  dp = 1
  tp = 1
  pp = 1
}

train {
  global_batch = 8
  micro_batch = 1
  steps = 100
  optimizer = adamw(lr = 1e-5, betas = (0.9, 0.95), weight_decay = 0.1)
  schedule = cosine(warmup = 10)
  precision = fp32
  data = synthetic  # your text: tokens("train.bin"), made by parc data prepare
  init = checkpoint("checkpoint")  # the imported weights, from this file's folder
  checkpoint = every(50, dir = "checkpoints")
}
"""


def spec_text(kind: str, rows: list[tuple[str, object, str]], source: str, padded_vocab: int | None = None) -> str:
    """``model.par``: the model block from ``rows`` (each value citing its config key), and the
    rest; ``padded_vocab``: the embedding's rows, as the loaded spec says (a comment)."""
    lines = [
        f"# Imported by parc import from {source} (transformers' {kind}); edit the mesh,",
        "# parallel and train blocks, then parc build.",
        f"model {kind} {{",
    ]
    for key, value, words in rows:
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)  # arch: a bare word
        comment = f"config.json {words}"
        if key == "vocab" and padded_vocab is not None:
            comment += f"; parc pads the embedding to {padded_vocab} rows (pad_vocab_to)"
        lines.append(f"  {key} = {text}  # {comment}")
    return "\n".join(lines) + "\n}\n\n" + TRAIN_BLOCK


# ---- the weights -------------------------------------------------------------------------


def weight_files(folder: str) -> dict[str, str]:
    """Hugging Face tensor name -> the safetensors file holding it."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    try:
        if os.path.exists(index):
            content = read_json(inside(folder, "model.safetensors.index.json"))
            mapping = content.get("weight_map") if isinstance(content, dict) else None
            if not isinstance(mapping, dict) or not all(isinstance(f, str) for f in mapping.values()):
                raise HfImportError(f"{index}: has no \"weight_map\" object of file names")
            return {name: str(inside(folder, file)) for name, file in mapping.items()}
        single = inside(folder, "model.safetensors")
    except (UnreadableFile, UnsafePath) as exc:
        raise HfImportError(f"{folder}: {exc}") from None
    if not os.path.isfile(single):
        raise HfImportError(f"{folder}: no model.safetensors nor model.safetensors.index.json "
                            "(save the model with safe_serialization)")
    try:
        with safe_open(single, "pt") as file:
            return {name: str(single) for name in file.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own errors on a damaged file
        raise HfImportError(f"{single}: not a readable safetensors file ({exc})") from None


class _Reader:
    """Tensors of a Hugging Face folder by name, each read when asked (Note [import streams])."""

    def __init__(self, files: dict[str, str], prefix: str):
        self.files, self.prefix, self.open = files, prefix, {}

    def key(self, name: str) -> str | None:
        """The file's name for tensor ``name``: as written, or without the base model's prefix."""
        short = name.removeprefix(self.prefix)
        return name if name in self.files else short if short in self.files else None

    def handle(self, key: str):
        from safetensors import safe_open

        path = self.files[key]
        if path not in self.open:
            try:
                self.open[path] = safe_open(path, "pt")
            except Exception as exc:  # noqa: BLE001 - a missing or damaged shard
                raise HfImportError(f"{path}: not a readable safetensors file ({exc})") from None
        return self.open[path]

    def shape(self, name: str) -> tuple[int, ...]:
        key = self.key(name)
        return tuple(self.handle(key).get_slice(key).get_shape())

    def tensor(self, name: str):
        import torch

        key = self.key(name)
        return self.handle(key).get_tensor(key).to(torch.float32)


def plan_links(model_config, reader: _Reader) -> list[tuple[hf_names.Link, list[tuple[int, ...]]]]:
    """Each link with its parc tensors' full shapes, every HF tensor there with the shape the
    config implies (else ``HfImportError`` naming it), every HF tensor used."""
    import dataclasses

    from parc.runtime.layout.model_desc import describe

    config = dataclasses.asdict(model_config)
    shapes = {f"{m.name}.{p.name}": p.shape for m in describe(model_config).modules if m.tied_to is None
              for p in m.params}
    found, used = [], set()
    for link in hf_names.links(config):
        parc_shapes = [shapes.pop(name) for name in link.parc]
        for name, shape in zip(link.hf, hf_names.hf_shapes(link, parc_shapes, config["vocab"])):
            if reader.key(name) is None:
                raise HfImportError(f"the weights have no tensor {name}, which config.json's model has")
            if reader.shape(name) != shape:
                raise HfImportError(f"{name} has shape {list(reader.shape(name))}, but config.json's model "
                                    f"has {list(shape)}")
            used.add(reader.key(name))
        found.append((link, parc_shapes))
    if shapes:
        raise RuntimeError(f"internal error in parc (import): no Hugging Face name for {sorted(shapes)}")
    if config["tie_embeddings"]:  # a copy of the tied embedding some checkpoints keep: transformers ignores it too
        used.add(reader.key("lm_head.weight"))
    extra = sorted(name for name in set(reader.files) - used if not name.endswith(hf_names.NOT_WEIGHTS))
    if extra:
        raise HfImportError(f"the weights hold {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}, which "
                            "parc's model has no place for (biases or layers parc lacks)")
    return found


def write_checkpoint(folder: str, model_config, reader: _Reader, source: str) -> None:
    """The weights-only checkpoint ``folder`` (Note [import streams])."""
    import dataclasses

    from parc.runtime.checkpoints import checkpoint_dcp
    from parc.runtime.checkpoints.checkpoint_files import FORMAT, INFO_FILE

    links = plan_links(model_config, reader)
    checkpoint_dcp.save({}, folder, [], planner=_streaming_planner(links, reader))
    info = dict(format=FORMAT, step=0, optimizer_step=0, world_size=1, samples_seen=0,
                layout=f"imported from Hugging Face ({source})", weights_only=True,
                model=dataclasses.asdict(model_config))
    with open(os.path.join(folder, INFO_FILE), "w", encoding="utf-8") as file:
        json.dump(info, file, indent=1, sort_keys=True)


def parc_tensor(name: str, link: hf_names.Link, shapes, reader: _Reader):
    """Parc tensor ``name`` of ``link``, read and converted now (Note [import streams])."""
    tensors = hf_names.from_hf(link, [reader.tensor(hf) for hf in link.hf], shapes)
    return tensors[link.parc.index(name)].clone()


def _streaming_planner(links, reader):
    """DCP's save planner over placeholders; each tensor read when DCP writes it (Note [import streams])."""
    import torch

    from parc.runtime.checkpoints import checkpoint_dcp
    from parc.runtime.checkpoints.checkpoint_shards import Piece

    by_name = {name: (link, shapes) for link, shapes in links for name in link.parc}

    class StreamingPlanner(checkpoint_dcp._SavePlanner):
        def lookup_object(self, index):
            name = index.fqn.removeprefix("model.")
            return parc_tensor(name, *by_name[name], reader)

    return StreamingPlanner([
        Piece(f"model.{name}", shape, (0,) * len(shape), torch.empty(shape, device="meta"))
        for link, shapes in links for name, shape in zip(link.parc, shapes)
    ])


# ---- the command ---------------------------------------------------------------------------


def import_folder(hf_dir: str, out: str, *, force: bool = False) -> str:
    """Write ``out/model.par`` and ``out/checkpoint/`` from the Hugging Face folder ``hf_dir``."""
    from parc.dsl import load
    from parc.dsl.diagnostics import Diagnostics

    if os.path.lexists(out) and not force:
        raise HfImportError(f"{out} exists: remove it, or pass --force to replace it")
    kind, rows = parc_model(read_config(hf_dir))
    reader = _Reader(weight_files(hf_dir), hf_names.BASE_PREFIX[kind])
    source = os.path.basename(os.path.normpath(os.path.abspath(hf_dir)))
    temporary = os.path.normpath(out) + ".parc-tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    try:
        spec_path = os.path.join(temporary, SPEC)
        with open(spec_path, "w", encoding="utf-8") as file:
            file.write(spec_text(kind, rows, source))
        try:
            spec = load(spec_path)
        except Diagnostics as exc:  # a config whose model parc's rules refuse (kv heads, ...)
            raise HfImportError(f"config.json's model breaks parc's rules:\n{exc}") from None
        with open(spec_path, "w", encoding="utf-8") as file:  # the same spec, its padding said
            file.write(spec_text(kind, rows, source, padded_vocab=spec.model.padded_vocab))
        write_checkpoint(os.path.join(temporary, CHECKPOINT), spec.model.config, reader, source)
        if os.path.lexists(out):  # --force: the old folder goes only once the new one is whole
            shutil.rmtree(out) if os.path.isdir(out) and not os.path.islink(out) else os.remove(out)
        os.replace(temporary, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return out
