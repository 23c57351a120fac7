"""docs/ci.md's shell recipe, run as written on a tiny repository of specs.

The script is cut out of the document between its ``ci.sh`` markers, so the recipe
users copy is the one tested. ``parc verify`` is skipped (``PARC_SKIP_VERIFY=1``):
it may run the trainer, and this test must stay fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ci.md"


def recipe() -> str:
    text = DOC.read_text()
    body = text.split("<!-- ci.sh: begin -->\n", 1)[1].split("<!-- ci.sh: end -->", 1)[0]
    assert body.startswith("```sh\n") and body.rstrip().endswith("```"), "ci.md: the script is one sh block"
    return body.removeprefix("```sh\n").rstrip().removesuffix("```")


@pytest.fixture
def repo(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "specs").mkdir()
    shutil.copy(ROOT / "examples" / "tiny.par", tmp_path / "specs" / "tiny.par")
    (tmp_path / "ci.sh").write_text(recipe())
    assert ci(tmp_path, "parc", "build", "specs/tiny.par").returncode == 0  # into build/tiny, the default
    return tmp_path


def ci(repo: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(command, cwd=repo, env=environment, capture_output=True, text=True, timeout=300)


def test_the_recipe_passes_a_fresh_repository_and_fails_a_stale_one(repo):
    done = ci(repo, "bash", "ci.sh", PARC_SKIP_VERIFY="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "+ parc check specs/tiny.par",
        "specs/tiny.par: ok",
        "+ parc fmt --check specs/tiny.par",
        "+ parc build specs/tiny.par -o build/tiny --check",
        "build/tiny: up to date",
        "parc verify: skipped (PARC_SKIP_VERIFY=1)",
    ]
    # A hand edit that merges passes too.
    train = repo / "build" / "tiny" / "train.py"
    train.write_text(train.read_text().replace("def main() -> None:\n", "def main() -> None:\n    # mine\n"))
    done = ci(repo, "bash", "ci.sh", PARC_SKIP_VERIFY="1")
    assert done.returncode == 0 and "build/tiny: edited, merges cleanly: train.py" in done.stdout
    # The spec changed and the build was not redone: stale, the script fails and says which step.
    spec = repo / "specs" / "tiny.par"
    spec.write_text(spec.read_text().replace("steps = 20", "steps = 30"))
    done = ci(repo, "bash", "ci.sh", PARC_SKIP_VERIFY="1")
    assert done.returncode == 1
    assert "FAILED (exit 1): parc build specs/tiny.par -o build/tiny --check" in done.stdout
    assert "build/tiny: stale: train.py" in done.stderr
    # Rebuilt (the edit merged in): it passes again.
    assert ci(repo, "parc", "build", "specs/tiny.par").returncode == 0
    assert "# mine" in train.read_text()
    assert ci(repo, "bash", "ci.sh", PARC_SKIP_VERIFY="1").returncode == 0


def test_a_parc_without_verify_skips_it_and_says_so(repo):
    done = ci(repo, "bash", "ci.sh")
    has_verify = ci(repo, "parc", "verify", "--help").returncode == 0
    if has_verify:
        pytest.skip("this parc has a verify command (the recipe runs it)")
    assert done.returncode == 0 and "parc verify: skipped (this parc has no verify command)" in done.stdout


def test_the_workflow_runs_the_same_four_checks():
    """The GitHub Actions block (not run here: no yaml parser is a dependency) names
    the four commands the shell recipe runs, each in a step of its own."""
    workflow = DOC.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    steps = workflow.split("      - name: ")[1:]
    commands = ["parc check specs/*.par", "parc fmt --check specs/*.par",
                'parc build "$spec" -o "build/$(basename "$spec" .par)" --check', 'parc verify "$spec"']
    for command in commands:
        assert sum(command in step for step in steps) == 1, command
        assert command.split('"$spec"')[0].replace("specs/*.par", "") in recipe()
    assert "\t" not in workflow
