"""The build's record (issue 31): a folder built with ``--set`` is judged against those
values (Note [the build records its --set]), and ``parc verify DIR`` hashes a spec that
reads a token file as the build did (``build.load_built``)."""

from __future__ import annotations

import json
from pathlib import Path

from parc.codegen.build import build_to
from parc.codegen.cli import main
from parc.codegen.verify_dir import _manifest, _spec_of

ROOT = Path(__file__).resolve().parents[2]
SETS = ["parallel.dp=4", "parallel.tp=1"]


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text())
    return spec


def test_the_manifest_records_the_set_values_and_check_uses_them(tmp_path, capsys):
    spec, out = _spec(tmp_path), tmp_path / "build"
    assert main(["build", str(spec), "-o", str(out), *(a for s in SETS for a in ("--set", s))]) == 0
    assert json.loads((out / ".parc" / "manifest.json").read_text())["set"] == SETS
    capsys.readouterr()
    assert main(["build", str(spec), "-o", str(out), "--check"]) == 0
    assert capsys.readouterr().out == f"{out}: up to date\n"
    spec.write_text(spec.read_text().replace("steps = 20", "steps = 21"))
    assert main(["build", str(spec), "-o", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"hint: rebuild it: parc build {spec} -o {out} --set parallel.dp=4 --set parallel.tp=1\n" in err


def test_a_build_without_set_records_none(tmp_path):
    out = build_to(_spec(tmp_path), tmp_path / "build")
    assert "set" not in json.loads((out / ".parc" / "manifest.json").read_text())


def test_verify_dir_hashes_a_token_file_spec_as_the_build_did(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    spec = _spec(project)
    sets = ['train.data=tokens("data/corpus.bin")']
    folder = build_to(spec, tmp_path / "build" / "tiny", sets)
    files, manifest = _manifest(folder)
    base = _spec_of(folder, str(spec), sets, manifest, files)  # raised "was not built from" before
    assert b'DATA_PATH = "../../project/data/corpus.bin"' in base["train.py"]
