"""`parc build`: goldens, determinism, --check, edit protection, --emit, diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parc.codegen.build import generate, seen_from
from parc.codegen.cli import main
from parc.codegen.lower import lower
from parc.dsl import load
from parc.dsl.diagnostics import Diagnostics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
BUILDABLE = ("tiny", "gpt2-small", "llama-7b")
GOLDEN_FILES = ("train.py", "launch.sh", "slurm.sbatch", "README.md", "plan.json", "plan.txt")
UPDATE = os.environ.get("PARC_UPDATE_GOLDEN") == "1"


def generated(example: str) -> dict[str, bytes]:
    """The files of `parc build examples/EXAMPLE.par` (into build/EXAMPLE, its default)."""
    spec = load(f"examples/{example}.par") if Path("examples").is_dir() else load(str(EXAMPLES / f"{example}.par"))
    spec = seen_from(spec, Path("build") / example)
    files = generate(spec)
    files["plan.txt"] = str(lower(spec)).encode()
    return files


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("example", BUILDABLE)
def test_golden_files(example):
    files = generated(example)
    folder = GOLDEN / example
    for name in GOLDEN_FILES:
        path = folder / name
        if UPDATE:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(files[name])
        assert path.is_file(), f"no golden {path}; run with PARC_UPDATE_GOLDEN=1"
        assert files[name].decode() == path.read_text(), f"{example}/{name} differs from its golden file"


def test_runtime_copy_is_byte_identical():
    files = generated("tiny")
    runtime = ROOT / "runtime"
    copied = {p[len("parc_runtime/"):] for p in files if p.startswith("parc_runtime/")}
    on_disk = {  # the Python modules and the kernels' C++ sources
        str(p.relative_to(runtime))
        for p in runtime.rglob("*")
        if p.suffix in (".py", ".cpp", ".h") and "__pycache__" not in p.parts
    }
    assert copied <= on_disk
    for rel in copied:
        assert files[f"parc_runtime/{rel}"] == (runtime / rel).read_bytes()


@pytest.mark.parametrize(
    "sets, ships, leaves",
    [
        # the checker's rules stay home: the trainer runs only the engine and the model's own shape rules
        # a CPU build's kernels are the C++ ones: Triton's modules (CUDA only) stay home
        ((), {"models/model.py", "parallel/data/dp.py", "checkpoints/checkpoint_dcp.py", "kernels/cpu/norms.cpp",
              "layout/rule_engine.py", "layout/model_rules.py", "models/parallelize.py", "parallel/tensor/sharding.py",
              "kernels/ops.py"},
         {"parallel/pipeline/pipeline.py", "parallel/data/zero.py", "parallel/tensor/overlap.py", "schedules/schedule.py",
          "layout/constraints/__init__.py", "layout/constraints/rules_unbuilt.py", "layout/layouts.py",
          "kernels/triton_ops.py", "kernels/triton_common.py", "kernels/triton_moe.py", "kernels/triton_add_norm.py",
          "parallel/context/context.py", "parallel/expert/moe.py"}),
        (("parallel.dp=1", "parallel.pp=2"), {"parallel/pipeline/pipeline.py", "schedules/schedule.py"},
         {"parallel/data/zero.py", "parallel/tensor/overlap.py", "parallel/data/dp.py", "schedules/schedule_zb.py",
          "schedules/schedule_zbv.py", "schedules/schedule_chimera.py", "schedules/schedule_terapipe.py",
          "parallel/pipeline/split_backward.py", "parallel/pipeline/terapipe.py"}),
        (("parallel.dp=1", "parallel.pp=2", "parallel.schedule=zero_bubble"),
         {"schedules/schedule_zb.py", "parallel/pipeline/split_backward.py"},
         {"schedules/schedule_zbv.py", "schedules/schedule_chimera.py", "schedules/schedule_terapipe.py"}),
        (("parallel.zero=1",), {"parallel/data/zero.py", "parallel/data/dp.py"},
         {"parallel/pipeline/pipeline.py", "parallel/tensor/overlap.py"}),
        (("parallel.overlap=sub_batch(2)",), {"parallel/tensor/overlap.py"},
         {"parallel/pipeline/pipeline.py", "parallel/data/zero.py"}),
    ],
)
def test_a_build_ships_only_the_runtime_it_uses(sets, ships, leaves, tmp_path, capsys):
    spec = load(str(EXAMPLES / "tiny.par"), list(sets))
    copied = {p[len("parc_runtime/"):] for p in generate(spec) if p.startswith("parc_runtime/")}
    assert ships <= copied and not leaves & copied, sorted(copied)
    # every runtime module a shipped one imports is shipped too: the trainer imports cleanly
    out = tmp_path / "b"
    assert main(["build", str(EXAMPLES / "tiny.par"), "-o", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    code = "import sys; sys.path.insert(0, '.'); import parc_runtime." + ", parc_runtime.".join(
        sorted({p.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
                for p in copied if p.endswith(".py") and p != "__init__.py"})
    )
    subprocess.run([sys.executable, "-c", code], cwd=out, check=True)
    # a later build that needs fewer modules removes the ones it no longer ships, and --check is clean
    assert main(["build", str(EXAMPLES / "tiny.par"), "-o", str(out)]) == 0
    assert main(["build", str(EXAMPLES / "tiny.par"), "-o", str(out), "--check"]) == 0
    assert not any((out / "parc_runtime" / name).exists()
                   for name in {"parallel/pipeline/pipeline.py", "parallel/data/zero.py", "parallel/tensor/overlap.py"})


def test_a_gpu_build_ships_the_triton_kernels():
    """A CPU build leaves kernels/'s Triton modules home (features.left_out); a GPU one ships them."""
    spec = load(str(EXAMPLES / "tiny.par"), ["mesh.device=h100-80gb"])
    copied = {p[len("parc_runtime/"):] for p in generate(spec) if p.startswith("parc_runtime/")}
    assert {"kernels/triton_ops.py", "kernels/triton_common.py", "kernels/triton_moe.py", "kernels/triton_add_norm.py",
            "kernels/cpu/norms.cpp"} <= copied


def test_a_trainer_imports_dcp_only_to_save_or_resume(tmp_path):
    """Note [DCP on demand]: train.py's imports leave torch.distributed.checkpoint out; checkpoint_dcp brings it."""
    out = tmp_path / "b"
    assert main(["build", str(EXAMPLES / "tiny.par"), "-o", str(out)]) == 0
    code = (
        "import sys; sys.path.insert(0, '.'); import train; "
        "assert 'torch.distributed.checkpoint' not in sys.modules, 'imported at start'; "
        "from parc_runtime.checkpoints import checkpoint_dcp; assert 'torch.distributed.checkpoint' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=out, check=True)


def test_build_is_deterministic_across_cwd(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["build", "examples/tiny.par", "-o", str(first)]) == 0
    os.chdir(tmp_path)
    assert main(["build", str(ROOT / "examples" / "tiny.par"), "-o", str(second)]) == 0
    names = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(second).as_posix() for p in second.rglob("*") if p.is_file())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    text = (first / "train.py").read_text()
    assert str(ROOT) not in text and str(tmp_path) not in text


def test_every_generated_file_has_a_header():
    for name, data in generated("tiny").items():
        if name.endswith((".py", ".sh", ".md")) and not name.startswith("parc_runtime/"):
            assert b"Generated by parc 0.1.0 from tiny.par" in data, name


def test_check_fresh_stale_edited_missing(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 0
    assert main(["build", "examples/tiny.par", "-o", str(out), "--check"]) == 0
    capsys.readouterr()
    # stale: the spec changed (here through --set)
    assert main(["build", "examples/tiny.par", "-o", str(out), "--check", "--set", "train.steps=7"]) == 1
    err = capsys.readouterr().err
    assert "stale: train.py" in err and "edited," not in err
    # hand-edited: allowed (tests/codegen/test_build_merge.py has the merges)
    train = out / "train.py"
    train.write_text(train.read_text() + "\n# my note\n")
    assert main(["build", "examples/tiny.par", "-o", str(out), "--check"]) == 0
    assert f"{out}: edited, merges cleanly: train.py" in capsys.readouterr().out
    # missing
    (out / "launch.sh").unlink()
    assert main(["build", "examples/tiny.par", "-o", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert "missing: launch.sh" in err and "edited, merges cleanly: train.py" in err


def test_rebuild_merges_edits_and_forces_over_conflicts(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 0
    train = out / "train.py"
    edited = train.read_text().replace("def main()", "def main():  # tuned by hand\n    pass\n\n\ndef _main()")
    train.write_text(edited)
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=7"]) == 0
    assert "merged your edits into train.py" in capsys.readouterr().out
    assert "STEPS = 7" in train.read_text() and "# tuned by hand" in train.read_text()
    # An edit on the line the spec changes conflicts; --force replaces it after a backup.
    mine = train.read_text().replace("STEPS = 7", "STEPS = 70")
    train.write_text(mine)
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=8"]) == 3
    assert train.read_text() == mine
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=8", "--force"]) == 0
    assert "STEPS = 8" in train.read_text() and (out / "train.py.orig").read_text() == mine
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=8", "--check"]) == 0


def test_stale_rebuild_without_edits_just_writes(tmp_path):
    out = tmp_path / "tiny"
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 0
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=9"]) == 0
    assert "STEPS = 9" in (out / "train.py").read_text()


def test_refuses_a_folder_parc_did_not_make(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 1
    assert "was not made by parc" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_user_files_survive_a_rebuild(tmp_path):
    out = tmp_path / "tiny"
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 0
    (out / "metrics.jsonl").write_text("{}\n")
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=3"]) == 0
    assert (out / "metrics.jsonl").read_text() == "{}\n"
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "train.steps=3", "--check"]) == 0


def test_emit_plan_prints_the_plan(capsys):
    assert main(["build", "examples/tiny.par", "--emit", "plan"]) == 0
    assert capsys.readouterr().out == (GOLDEN / "tiny" / "plan.txt").read_text()


def test_emit_spec_and_ast(capsys):
    assert main(["build", "examples/tiny.par", "--emit", "spec"]) == 0
    assert '"tp": 2' in capsys.readouterr().out
    assert main(["build", "examples/tiny.par", "--emit", "ast"]) == 0
    assert "gpt_tiny" in capsys.readouterr().out


@pytest.mark.parametrize(
    "sets,code,words",
    [
        (["parallel.zero=3", "parallel.compress=powersgd(rank = 4)", "parallel.dp=2"], "PAR0270",
         "compress = powersgd with zero = 3"),
    ],
)
def test_unsupported_features_point_at_the_spec(sets, code, words):
    with pytest.raises(Diagnostics) as info:
        generate(load("examples/tiny.par", sets))
    assert any(e.code == code and words in e.message for e in info.value.errors), info.value.errors


@pytest.mark.parametrize("sets", [[], ["parallel.dp=4", "parallel.tp=1"], ["parallel.pp=2", "parallel.tp=1"]])
def test_fp16_builds_fp16_parameters_with_dynamic_loss_scaling(sets):
    files = generate(load("examples/tiny.par", ["train.precision=fp16", *sets]))
    text = files["train.py"].decode()
    # the scale multiplies the global loss: each rank's backward runs on its share of it
    assert "scaler = loss_scale.DynamicLossScale(rank=dist.rank, data_ranks=DP)" in text  # tiny: dp 2 or 4
    # fp16 parameters with fp32 masters (runtime/optimizers/master.py), not autocast over fp32 weights
    assert "optimizer = master.MasterAdamW(" in text and "dtype=torch.float16" in text
    assert "torch.autocast" not in text and "parc_runtime/optimizers/master.py" in files
    assert "optimizer.unscale_and_clip(" in text
    assert "scaled_by = scaler.begin(step)" in text and "grad_scale=scaled_by" in text
    assert "stepping = scaler.update(step, grad_norm)" in text and '"loss_scale": scaler.scale' in text
    assert "torch.float16" in text and "parc_runtime/optimizers/loss_scale.py" in files
    pipelined = "parallel.pp=2" in sets
    assert ("runner.loss_scale = scaled_by" in text) == pipelined
    assert ("(loss * scaled_by).backward()" in text) != pipelined


def test_unbuildable_optimizer_in_a_hand_built_spec_is_par0802():
    """PAR0802 is build-only now (fp16 and ring attention are built): the schema admits
    only adamw, so a Spec built by hand is what asks for another optimizer."""
    import dataclasses

    spec = load("examples/tiny.par", [])
    train = dataclasses.replace(spec.train, optimizer=dataclasses.replace(spec.train.optimizer, name="sgd"))
    with pytest.raises(Diagnostics) as info:
        generate(dataclasses.replace(spec, train=train))
    assert any(e.code == "PAR0802" and "sgd" in e.message for e in info.value.errors), info.value.errors


def test_grad_reduce_bf16_builds_bf16_buckets():
    files = generate(load("examples/tiny.par", ["train.grad_reduce=bf16"]))
    text = files["train.py"].decode()
    assert "reduce_dtype=torch.bfloat16" in text and "import torch" in text
    fp32 = generate(load("examples/tiny.par", []))["train.py"].decode()
    assert "reduce_dtype" not in fp32


def test_zero3_builds_fsdp_with_its_settings():
    files = generate(load("examples/tiny.par", ["parallel.zero=3", "parallel.dp=2"]))
    text = files["train.py"].decode()
    assert "fsdp.FullyShardedAdamW(" in text and "ShardedAdamW(net" not in text.replace("FullyShardedAdamW(net", "")
    assert "ZERO_PREFETCH = 1  # default" in text and 'ZERO_SHARD = "dp"' in text
    assert "parc_runtime/parallel/data/fsdp.py" in files


def test_auto_layout_builds_the_planners_winner(tmp_path, capsys):
    out = tmp_path / "gpt3"
    assert main(["build", "examples/gpt3-175b.par", "-o", str(out)]) == 0
    text = (out / "train.py").read_text()
    plan = json.loads((out / "plan.json").read_text())
    degrees = {axis["axis"]: axis["size"] for axis in plan["mesh"]["axes"]}
    assert degrees["dp"] * degrees["tp"] * degrees["pp"] == 1024
    assert f"TP = {degrees['tp']}" in text and f"DP = {degrees['dp']}" in text


def test_missing_spec_is_a_usage_error(capsys):
    assert main(["build", "examples/nope.par"]) == 2
    assert "cannot read examples/nope.par" in capsys.readouterr().err


def test_single_rank_build_runs_under_plain_python(tmp_path):
    out = tmp_path / "one"
    assert main(["build", "examples/tiny.par", "-o", str(out), "--set", "parallel.dp=1",
                 "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=1"]) == 0
    text = (out / "train.py").read_text()
    assert "TP_PLAN = {}" in text and "dp_group" not in text and "tp_group =" not in text
    done = subprocess.run([sys.executable, "train.py", "--steps", "2", "--metrics-jsonl", "m.jsonl"],
                          cwd=out, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert len((out / "m.jsonl").read_text().splitlines()) == 2


def test_wrong_world_size_is_a_clear_error(tmp_path):
    out = tmp_path / "tiny"
    assert main(["build", "examples/tiny.par", "-o", str(out)]) == 0
    done = subprocess.run([sys.executable, "train.py", "--steps", "1"], cwd=out,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "needs 4 processes, but WORLD_SIZE is 1" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("example", BUILDABLE)
def test_generated_scripts_are_valid(example):
    import ast

    files = generated(example)
    ast.parse(files["train.py"].decode())
    done = subprocess.run(["bash", "-n"], input=files["launch.sh"].decode(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_steps_help_says_the_lr_schedule_keeps_its_length(tmp_path):
    out = tmp_path / "b"
    assert main(["build", str(EXAMPLES / "tiny.par"), "-o", str(out)]) == 0
    done = subprocess.run([sys.executable, str(out / "train.py"), "--help"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert " ".join(done.stdout.split()).count(
        "--steps STEPS optimizer steps to run (default 20); the LR schedule keeps the spec's length, STEPS: "
        "steps past it run at the minimum LR") == 1, done.stdout


def _waits_in_loops(tree, loop_matches) -> list[int]:
    """Lines of ``.item()``/``float(...)`` calls (a wait for the device) inside matching loops."""
    import ast

    found = []
    for loop in ast.walk(tree):
        if isinstance(loop, ast.For) and loop_matches(ast.unparse(loop.iter)):
            for node in ast.walk(loop):
                if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "item")
                    or (isinstance(node.func, ast.Name) and node.func.id == "float")
                ):
                    found.append(node.lineno)
    return found


@pytest.mark.parametrize("sets", [(), ("parallel.dp=1", "parallel.pp=2")])
def test_the_loss_is_awaited_once_a_step_not_once_a_micro_batch(sets):
    """On a GPU each .item() waits for the device: the micro-batch loops hold none."""
    import ast
    import inspect

    from parc.runtime.parallel.pipeline import pipeline

    train = generate(load("examples/tiny.par", list(sets)))["train.py"].decode()
    assert _waits_in_loops(ast.parse(train), lambda it: it == "range(GRAD_ACCUM)") == []
    assert "loss_sum = loss_sum.item()" in train or "runner.step(batch)" in train
    source = inspect.getsource(pipeline.PipelineExecutor.step)
    step = ast.parse(__import__("textwrap").dedent(source))
    assert _waits_in_loops(step, lambda it: it == "self.actions") == []


def test_uneven_terapipe_slices_are_written_as_their_lengths():
    """terapipe(slices = [n0, n1, ...]): the trainer lists the slices' tokens, schedules
    len(SLICES) of them and counts a backward per slice in the gradient reducers."""
    sets = ["parallel.dp=2", "parallel.tp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = [32, 16, 16])"]
    text = generate(load("examples/tiny.par", sets))["train.py"].decode()
    assert "\nSLICES = [32, 16, 16]\n" in text
    assert "slices=len(SLICES)" in text and "slices=tuple(SLICES),  # tokens of each slice" in text
    assert "accumulations=GRAD_ACCUM * len(SLICES)" in text and "SEQ_LEN // SLICES" not in text
    even = generate(load("examples/tiny.par", [*sets[:3], "parallel.schedule=terapipe(slices = 2)"]))["train.py"]
    assert b"\nSLICES = 2  #" in even and b"slices=(SEQ_LEN // SLICES,) * SLICES," in even
