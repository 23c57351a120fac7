"""``parc import`` of real transformers folders, ``--init-from`` in two layouts, and the way back.

Each model (gpt2, llama with grouped-query attention and an untied head, Mixtral with 4
experts) is written by transformers itself (hf_models.py), imported, and then: exported
again, every tensor bit for bit; trained from its imported weights, whose step-1 loss must
be transformers' loss on the same global batch (the synthetic data of the spec's seed,
samples 0..G-1) at one rank and at tp 2; and a short fine-tune at one rank must lower the
loss. Configs parc cannot hold are refused naming the key, with nothing written.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from parc.codegen.build import build_to
from parc.codegen.cli import main as parc_main
from parc.dsl import load
from parc.runtime.train import data
from parity.batch import Case

from .hf_models import SEQ, VOCAB, hf_loss, write
from .trainer import run

KINDS = ("gpt2", "llama", "mixtral")
TWO = "mesh.devices_per_node=2"
LAYOUTS = {  # name -> (--set overrides, ranks)
    "one": ([], 1),
    "tp2": (["parallel.tp=2", TWO], 2),
    # the same loader in the other layouts (Checkpoints' boxes: runtime/checkpoints/checkpoint_init.py)
    "pp2": (["parallel.pp=2", TWO], 2),
    "zero3_dp2": (["parallel.dp=2", "parallel.zero=3", TWO], 2),
    "ep2_dp2": (["parallel.dp=2", "parallel.ep=2", TWO], 2),
    "cp2_ring": (["parallel.cp=2", "parallel.cp_kind=ring", TWO], 2),
}
BATCH = ["train.global_batch=4", "train.micro_batch=2"]


@functools.cache
def imported_folders(kind: str) -> tuple[Path, Path]:
    """(the transformers folder, the ``parc import`` output) of ``kind``, made once a process
    (the trainers' cases name the imported spec before any fixture runs)."""
    root = Path(tempfile.mkdtemp(prefix=f"parc-hf-{kind}-"))
    hf = write(kind, root / kind)
    assert parc_main(["import", str(hf), "-o", str(root / "parc")]) == 0
    return hf, root / "parc"


@pytest.fixture(scope="module")
def imported():
    """``imported(kind)``: (the transformers folder, the ``parc import`` output), made once."""
    return imported_folders


@pytest.mark.parametrize("kind", KINDS)
def test_export_of_an_import_gives_back_every_tensor_bit_for_bit(kind, imported, tmp_path):
    hf, out = imported(kind)
    assert parc_main(["export", str(out / "checkpoint"), "--to", "safetensors", str(tmp_path / "back")]) == 0
    original, back = load_file(hf / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(original) == sorted(back)
    assert [name for name in original if not torch.equal(original[name], back[name])] == []
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == kind and config["vocab_size"] == VOCAB
    # and its config.json is the same model to transformers (rope theta, norm eps, experts, ...)
    inputs, targets = data.SyntheticTokens(VOCAB, SEQ, seed=5).batch(range(2))
    assert hf_loss(tmp_path / "back", inputs, targets) == hf_loss(hf, inputs, targets)


def test_the_spec_cites_each_config_key_and_is_canonical(imported, capsys):
    _, out = imported("llama")
    text = (out / "model.par").read_text()
    for line in (
        'kv_heads = 2  # config.json "num_key_value_heads"',
        'vocab = 250  # config.json "vocab_size"; parc pads the embedding to 256 rows (pad_vocab_to)',
        'norm_eps = 1e-06  # config.json "rms_norm_eps"',
        'tie_embeddings = false  # config.json "tie_word_embeddings"',
        'init = checkpoint("checkpoint")  # the imported weights, from this file\'s folder',
    ):
        assert f"  {line}\n" in text, line
    assert any(line.startswith("  rope_theta = 5000.0  # config.json ") for line in text.splitlines())
    assert parc_main(["fmt", "--check", str(out / "model.par")]) == 0
    spec = load(str(out / "model.par"))
    assert (spec.model.padded_vocab, spec.train.init_from) == (256, "checkpoint")
    info = json.loads((out / "checkpoint" / "parc.json").read_text())
    assert info["weights_only"] and info["step"] == 0 and info["model"]["padded_vocab"] == 256


STEP_ONE = [
    *[(kind, layout) for kind in KINDS for layout in ("one", "tp2")],
    ("llama", "pp2"), ("gpt2", "zero3_dp2"), ("mixtral", "ep2_dp2"), ("llama", "cp2_ring"),
]
FINE_TUNE = ("llama", "one")
"""This row trains 4 steps at a higher rate as well: a short fine-tune, whose loss falls."""


def step_one_case(kind: str, layout: str) -> Case:
    """The imported ``kind`` trained from its weights in ``layout`` (tests/conftest.py's ``trainers``)."""
    _, out = imported_folders(kind)
    sets, ranks = LAYOUTS[layout]
    fast = ["train.optimizer=adamw(lr = 3e-3)", "train.schedule=constant"] if (kind, layout) == FINE_TUNE else []
    return Case(f"hf-{kind}-{layout}", str(out / "model.par"), (*sets, *BATCH, *fast), ranks,
                ("--steps", "4" if fast else "1"))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads."""
    if item.originalname == "test_step_one_loss_from_the_import_is_transformers_loss":
        return [step_one_case(item.callspec.params["kind"], item.callspec.params["layout"])]
    return []


@pytest.mark.parametrize("kind, layout", STEP_ONE)
def test_step_one_loss_from_the_import_is_transformers_loss(kind, layout, trainers):
    hf, out = imported_folders(kind)
    spec = load(str(out / "model.par"), BATCH)
    inputs, targets = data.SyntheticTokens(VOCAB, SEQ, seed=spec.train.seed).batch(range(spec.train.global_batch))
    expected = hf_loss(hf, inputs, targets)
    done = trainers.run(step_one_case(kind, layout))
    assert "initialized from" in done.log.read_text()
    losses = {row["step"]: row["loss"] for row in done.records}
    if (kind, layout) == FINE_TUNE:
        assert losses[4] < losses[1] - 0.05, losses
    assert abs(losses[1] - expected) <= 1e-4 * expected, (losses[1], expected)


def test_a_sharded_folder_imports_as_the_single_file_does(imported, tmp_path):
    hf, out = imported("llama")
    sharded = write("llama", tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert parc_main(["import", str(sharded), "-o", str(tmp_path / "parc")]) == 0
    assert parc_main(["export", str(tmp_path / "parc" / "checkpoint"), "--to", "safetensors", str(tmp_path / "back")]) == 0
    back, original = load_file(tmp_path / "back" / "model.safetensors"), load_file(hf / "model.safetensors")
    assert all(torch.equal(back[name], original[name]) for name in original)


def edited(imported, tmp_path, kind: str, **changes):
    """A copy of ``kind``'s folder whose config.json has ``changes`` (None: the key removed)."""
    hf, _ = imported(kind)
    folder = tmp_path / "edited"
    shutil.copytree(hf, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind, changes, message", [
    ("llama", {"model_type": "gemma"}, '"model_type" = \'gemma\': parc imports gpt2, llama, mixtral, qwen2, qwen3'),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "\"rope_parameters\": rope_type 'llama3': parc's rotary has no scaling (only rope_type \"default\")"),
    ("llama", {"attention_bias": True}, '"attention_bias" = true: parc\'s llama has false only'),
    ("llama", {"head_dim": 16},  # read as parc's model.head_dim: the weights are not that model's
     "model.layers.0.self_attn.q_proj.weight has shape [32, 32], but config.json's model has [64, 32]"),
    ("gpt2", {"attn_pdrop": 0.1}, '"attn_pdrop" = 0.1 but "resid_pdrop" = 0.0: parc has one dropout for both'),
    ("mixtral", {"sliding_window": 16},
     '"sliding_window" = 16: parc attends to the whole sequence (max_position_embeddings = 32)'),
    ("llama", {"intermediate_size": 48},
     "model.layers.0.mlp.gate_proj.weight has shape [64, 32], but config.json's model has [48, 32]"),
])
def test_a_config_parc_cannot_hold_is_one_line_naming_the_key(kind, changes, message, imported, tmp_path, capsys):
    folder = edited(imported, tmp_path, kind, **changes)
    assert parc_main(["import", str(folder), "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"parc import: {folder}: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited"]  # nothing written, no leftovers


def test_an_existing_out_folder_is_never_replaced_silently(imported, tmp_path, capsys):
    hf, _ = imported("gpt2")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    assert parc_main(["import", str(hf), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"parc import: {tmp_path / 'out'} exists: remove it, or pass --force to replace it\n"
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep"
    assert parc_main(["import", str(hf), "-o", str(tmp_path / "out"), "--force"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint", "model.par"]


def test_another_models_checkpoint_is_refused_naming_the_tensors(imported, tmp_path):
    """The parity gpt (hidden 64, vocab 256) cannot start from the imported gpt2 (hidden 32)."""
    from .trainer import build

    _, out = imported("gpt2")
    build_dir = build("one", tmp_path / "build")
    done = run(build_dir, 1, ["--steps", "1", "--init-from", str(out / "checkpoint")], expect=1)
    assert done.stderr.strip().splitlines()[-1] == (
        f"train.py: --init-from {out / 'checkpoint'} is a checkpoint of another model (hidden 32 there, 64 here; "
        "head_dim 8 there, 16 here): "
        "embed.weight [256, 32] there, [256, 64] here; final_norm.bias [32] there, [64] here; "
        "final_norm.weight [32] there, [64] here; layers.0.attn.k_proj.bias [32] there, [64] here; "
        "layers.0.attn.k_proj.weight [32, 32] there, [64, 64] here; layers.0.attn.o_proj.bias [32] there, [64] here; "
        "and 28 more"
    )
    assert "Traceback" not in done.stderr


def test_resume_from_an_import_points_at_init_from(imported, tmp_path):
    _, out = imported("gpt2")
    build_dir = tmp_path / "build"
    build_to(out / "model.par", build_dir, BATCH)
    done = run(build_dir, 1, ["--steps", "1", "--resume", str(out / "checkpoint")], expect=1)
    ckpt = out / "checkpoint"
    assert done.stderr.strip().splitlines()[-1] == (
        f"train.py: {ckpt} holds weights only (parc import): start from it with --init-from {ckpt}")


def test_names_without_the_base_prefix_and_buffers_import_as_transformers_loads_them(imported, tmp_path):
    """The original gpt2 on the Hub: ``h.0...``, not ``transformer.h.0...``, with the causal-mask
    buffers and a copy of the tied embedding as lm_head; all read as transformers reads them."""
    from safetensors.torch import save_file

    hf, _ = imported("gpt2")
    original = load_file(hf / "model.safetensors")
    old = {name.removeprefix("transformer."): tensor for name, tensor in original.items()}
    old["h.0.attn.bias"] = torch.ones(1, 1, SEQ, SEQ).tril()
    old["lm_head.weight"] = original["transformer.wte.weight"].clone()
    folder = tmp_path / "old"
    folder.mkdir()
    shutil.copy(hf / "config.json", folder / "config.json")
    save_file(old, folder / "model.safetensors")
    assert parc_main(["import", str(folder), "-o", str(tmp_path / "parc")]) == 0
    assert parc_main(["export", str(tmp_path / "parc" / "checkpoint"), "--to", "safetensors", str(tmp_path / "back")]) == 0
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(original) and all(torch.equal(back[n], original[n]) for n in original)


def test_a_tensor_parc_has_no_place_for_is_refused_naming_it(imported, tmp_path, capsys):
    from safetensors.torch import save_file

    hf, _ = imported("llama")
    folder = tmp_path / "biased"
    shutil.copytree(hf, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.1.self_attn.q_proj.bias"] = torch.zeros(32)
    save_file(weights, folder / "model.safetensors")
    assert parc_main(["import", str(folder), "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"parc import: {folder}: the weights hold model.layers.1.self_attn.q_proj.bias, which parc's model has "
        "no place for (biases or layers parc lacks)\n")
    assert not (tmp_path / "out").exists()


def test_the_import_holds_one_tensor_at_a_time(imported, tmp_path, monkeypatch):
    """Note [import streams]: when DCP asks for a tensor, the memory of those before is freed."""
    import gc
    import weakref

    from parc.codegen import hf_import

    hf, _ = imported("mixtral")
    made, alive_at_each = [], []
    real = hf_import.parc_tensor

    def watched(*args):
        gc.collect()
        alive_at_each.append(sum(ref() is not None for ref in made))
        tensor = real(*args)
        made.append(weakref.ref(tensor.untyped_storage()))  # alive while any view of it is
        return tensor

    monkeypatch.setattr(hf_import, "parc_tensor", watched)
    assert parc_main(["import", str(hf), "-o", str(tmp_path / "out")]) == 0
    # DCP's write loop still holds the tensor it wrote last while it asks for the next one:
    # at most one alive; a writer keeping a file's tensors until it closes holds them all
    assert len(alive_at_each) == 23 and max(alive_at_each) == 1, alive_at_each


def test_a_damaged_weights_file_is_one_line(imported, tmp_path, capsys):
    hf, _ = imported("gpt2")
    folder = tmp_path / "damaged"
    shutil.copytree(hf, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    assert parc_main(["import", str(folder), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"parc import: {folder}: {folder / 'model.safetensors'}: not a readable safetensors file (")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
