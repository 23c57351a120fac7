"""Hand edits in a build folder are first-class (Note [3-way merge of a build]).

A rebuild merges the user's edits with the new generation against the text parc
generated last (``.parc/base/``); a conflict writes nothing and exits 3 unless
``--write-conflicts``, ``--force`` (a ``.orig`` backup) or ``--accept``; ``--check``
exits 0/1/2/3; ``--diff`` prints both diffs. Messages are compared as rendered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parc.codegen.build import generate
from parc.codegen.cli import main
from parc.dsl import load

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.par")
MAIN = "def main() -> None:\n"
NOTE = "    # tuned by hand: keep this\n"


def line_of(words: str) -> int:
    """The line of the tiny build's train.py that starts with ``words`` (goldens move lines)."""
    lines = generate(load(TINY))["train.py"].decode().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.lstrip().startswith(words))


STEPS = line_of("STEPS = 20")
DOC_STEPS = line_of("--steps N")
MAIN_LINE = line_of("def main()")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def out(tmp_path, capsys):
    folder = tmp_path / "tiny"
    assert main(["build", TINY, "-o", str(folder)]) == 0
    capsys.readouterr()
    return folder


def build(*extra: str, out: Path) -> list[str]:
    return ["build", TINY, "-o", str(out), *extra]


def edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    return path.read_text()


def test_the_base_is_what_parc_generated(out):
    files = generate(load(TINY))
    manifest = json.loads((out / ".parc" / "manifest.json").read_text())
    assert manifest["format"] == 2 and ".parc/manifest.json" not in manifest["files"]
    for path in manifest["files"]:
        assert (out / ".parc" / "base" / path).read_bytes() == files[path]


def test_an_edit_survives_a_spec_change_on_other_lines(out, capsys):
    train = out / "train.py"
    edit(train, MAIN, MAIN + NOTE)
    status, stdout, err = run(capsys, *build("--set", "train.steps=7", out=out))
    assert (status, err) == (0, "")
    assert stdout.splitlines()[0] == (
        f"{out}: merged your edits into train.py (1 edit of yours kept, 2 changes of the new generation applied)"
    )
    text = train.read_text()
    assert NOTE in text and "STEPS = 7  # --set 1\n" in text
    assert (out / ".parc" / "base" / "train.py").read_text() == text.replace(NOTE, "")
    assert run(capsys, *build("--set", "train.steps=7", "--check", out=out)) == (
        0, f"{out}: up to date\n{out}: edited, merges cleanly: train.py\n", "")
    # The same rebuild again changes nothing and says the edit is kept.
    status, stdout, _ = run(capsys, *build("--set", "train.steps=7", out=out))
    assert status == 0 and stdout.startswith(f"{out}: kept your edits to train.py (the new generation does not change it)\n")
    assert "(72 files, 0 changed)" in stdout


def test_a_conflict_shows_the_hunk_and_writes_nothing(out, capsys):
    edit(out / "train.py", "STEPS = 20  # tiny.par:29\n", "STEPS = 100  # mine\n")
    before = snapshot(out)
    status, stdout, err = run(capsys, *build("--set", "train.steps=7", out=out))
    assert (status, stdout) == (3, "")
    assert err == f"""\
parc build: {out}/train.py: your edits conflict with the new generation (1 hunk)
{out}/train.py:{STEPS}: (new generation: line {STEPS})
<<<<<<< yours
STEPS = 100  # mine
||||||| last generated
STEPS = 20  # tiny.par:29
=======
STEPS = 7  # --set 1
>>>>>>> new generation
parc build: nothing was written (1 file of yours does not merge with the new generation)
hint: edit your files so they merge, or run `parc build {TINY} -o {out} --set train.steps=7` with \
--write-conflicts (git-style markers to resolve), --force (yours saved as train.py.orig, then replaced) \
or --accept (yours kept as it is); --diff shows the differences
"""
    assert snapshot(out) == before


def test_write_conflicts_leaves_markers_that_check_and_build_refuse(out, capsys):
    train = out / "train.py"
    edit(train, "STEPS = 20  # tiny.par:29\n", "STEPS = 100  # mine\n")
    status, stdout, err = run(capsys, *build("--set", "train.steps=7", "--write-conflicts", out=out))
    assert status == 3 and f"wrote {out}/ (72 files, 2 changed)" in stdout
    assert err == (f"{out}/train.py: wrote conflict markers\nhint: resolve the <<<<<<< ... >>>>>>> markers, "
                   f"then `parc build {TINY} -o {out} --set train.steps=7 --check` exits 0\n")
    assert (
        "<<<<<<< yours\nSTEPS = 100  # mine\n||||||| last generated\nSTEPS = 20  # tiny.par:29\n"
        "=======\nSTEPS = 7  # --set 1\n>>>>>>> new generation\n"
    ) in train.read_text()
    status, _, err = run(capsys, *build("--set", "train.steps=7", "--check", out=out))
    assert status == 3 and f"{out}: unresolved conflict markers: train.py (line {STEPS})\n" in err
    for flag in ((), ("--accept",), ("--write-conflicts",)):
        before = snapshot(out)
        status, _, err = run(capsys, *build("--set", "train.steps=7", *flag, out=out))
        assert status == 3 and err.startswith(
            f"parc build: {out}/train.py still holds conflict markers (line {STEPS}); resolve them first\n")
        assert snapshot(out) == before
    # Resolved by hand: the folder is fresh, the resolution an edit.
    text = train.read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>> new generation\n") + len(">>>>>>> new generation\n")
    train.write_text(text[:start] + "STEPS = 70  # resolved\n" + text[end:])
    assert run(capsys, *build("--set", "train.steps=7", "--check", out=out)) == (
        0, f"{out}: up to date\n{out}: edited, merges cleanly: train.py\n", "")


@pytest.mark.parametrize("left", [
    "<<<<<<< yours\nSTEPS = 100  # mine\n",  # the rest of the block deleted
    "STEPS = 100  # mine\n>>>>>>> new generation\n",
    "<<<<<<<\nSTEPS = 100  # mine\n",  # a bare marker
], ids=["lone-start", "lone-end", "bare-start"])
def test_a_conflict_half_resolved_is_not_up_to_date(out, capsys, left):
    """One marker left alone (the rest of the block removed) is still a conflict not resolved:
    train.py no longer parses, so --check cannot call it up to date and a rebuild stops."""
    edit(out / "train.py", "STEPS = 20  # tiny.par:29\n", left)
    marker = STEPS if left[0] == "<" else STEPS + 1
    status, _, err = run(capsys, *build("--check", out=out))
    assert status == 3 and err.startswith(f"{out}: unresolved conflict markers: train.py (line {marker})\n")
    before = snapshot(out)
    for flag in ((), ("--accept",), ("--write-conflicts",)):
        status, _, err = run(capsys, *build(*flag, out=out))
        assert status == 3 and err.startswith(f"parc build: {out}/train.py still holds conflict markers "
                                              f"(line {marker}); resolve them first\n")
        assert snapshot(out) == before


def test_a_train_py_that_no_longer_parses_is_not_up_to_date(out, capsys):
    """No marker, but an edit that breaks the syntax: the same stop, saying where it breaks."""
    edit(out / "train.py", "STEPS = 20  # tiny.par:29\n", "STEPS = (20  # tiny.par:29\n")
    status, _, err = run(capsys, *build("--check", out=out))
    assert status == 3
    assert err.startswith(f"{out}: edited, no longer parses: train.py (line {STEPS}: ")
    before = snapshot(out)
    status, _, err = run(capsys, *build("--accept", out=out))
    assert status == 3 and err.startswith(f"parc build: {out}/train.py no longer parses as Python (line {STEPS}: ")
    assert f"hint: fix the file by hand (or run `parc build {TINY} -o {out}` with --force" in err
    assert snapshot(out) == before
    status, stdout, _ = run(capsys, *build("--force", out=out))
    assert status == 0 and f"saved your train.py as train.py.orig" in stdout
    assert run(capsys, *build("--check", out=out))[0] == 0


def test_force_saves_yours_first(out, capsys):
    train = out / "train.py"
    mine = edit(train, "STEPS = 20  # tiny.par:29\n", "STEPS = 100  # mine\n")
    status, stdout, err = run(capsys, *build("--set", "train.steps=7", "--force", out=out))
    assert (status, err) == (0, "")
    assert stdout.startswith(f"{out}: saved your train.py as train.py.orig, then wrote the new generation\n")
    assert (out / "train.py.orig").read_text() == mine and "STEPS = 7  # --set 1\n" in train.read_text()
    # A second forced rebuild never replaces the first backup.
    again = edit(train, "STEPS = 7  # --set 1\n", "STEPS = 200  # mine again\n")
    assert main(build("--set", "train.steps=8", "--force", out=out)) == 0
    assert (out / "train.py.orig").read_text() == mine and (out / "train.py.orig.1").read_text() == again
    assert main(build("--set", "train.steps=8", "--check", out=out)) == 0  # backups are the user's files


def test_accept_keeps_yours_as_it_is_and_later_edits_merge_against_the_new_base(out, capsys):
    train = out / "train.py"
    mine = edit(train, "STEPS = 20  # tiny.par:29\n", "STEPS = 100  # mine\n")
    status, stdout, err = run(capsys, *build("--set", "train.steps=7", "--accept", out=out))
    assert (status, err) == (0, "")
    assert stdout.startswith(f"{out}: accepted your train.py as it is (recorded against the new generation)\n")
    assert train.read_text() == mine  # as it is: the docstring's "(default 20)" too
    assert run(capsys, *build("--set", "train.steps=7", "--check", out=out))[0] == 0
    # A change elsewhere now merges against the new base; the accepted lines stay yours.
    assert main(build("--set", "train.steps=7", "--set", "train.schedule=cosine(warmup = 3)", out=out)) == 0
    text = train.read_text()
    assert "STEPS = 100  # mine\n" in text and "WARMUP = 3  # --set 2\n" in text


def test_check_exit_codes(out, capsys, tmp_path):
    assert run(capsys, *build("--check", out=out)) == (0, f"{out}: up to date\n", "")
    status, stdout, err = run(capsys, *build("--check", "--set", "train.steps=7", out=out))
    assert (status, stdout) == (1, "")
    assert err == (f"{out}: stale: plan.json\n{out}: stale: train.py\n"
                   f"hint: rebuild it: parc build {TINY} -o {out} --set train.steps=7\n")  # never the manifest
    missing = tmp_path / "nowhere"
    assert run(capsys, *build("--check", out=missing)) == (
        2, "", f"parc build: error: {missing}: no such folder, nothing to check\n"
               f"hint: build it first: parc build {TINY} -o {missing}\n")
    (tmp_path / "empty").mkdir()
    status, _, err = run(capsys, *build("--check", out=tmp_path / "empty"))
    assert status == 2 and err.startswith(f"parc build: error: {tmp_path / 'empty'} is not a parc build")
    edit(out / "train.py", "STEPS = 20  # tiny.par:29\n", "STEPS = 100  # mine\n")
    status, _, err = run(capsys, *build("--check", "--set", "train.steps=7", out=out))
    assert status == 3 and err.startswith(
        f"{out}: stale: plan.json\n{out}: edited, conflicts with the new generation: train.py "
        f"(1 hunk, the first at line {STEPS})\nhint: edit your files so they merge")


def test_diff_prints_both_diffs_and_writes_nothing(out, capsys):
    edit(out / "train.py", MAIN, MAIN + NOTE)
    before = snapshot(out)
    status, stdout, err = run(capsys, *build("--diff", "--set", "train.steps=7", out=out))
    assert status == 1 and snapshot(out) == before
    assert err.startswith(f"{out}: stale: plan.json\n{out}: stale: train.py (edited; your edits merge cleanly)\n")
    mine = (f"--- {out}/train.py\t(last generated)\n+++ {out}/train.py\t(yours)\n"
            f"@@ -{MAIN_LINE - 2},6 +{MAIN_LINE - 2},7 @@\n \n \n {MAIN}+{NOTE}")
    written = (f"--- {out}/train.py\t(on disk)\n+++ {out}/train.py\t(would be written)\n"
               f"@@ -{DOC_STEPS - 3},7 +{DOC_STEPS - 3},7 @@\n")
    assert mine in stdout and written in stdout
    assert "-STEPS = 20  # tiny.par:29\n+STEPS = 7  # --set 1\n" in stdout
    assert stdout.index(f"--- {out}/plan.json\t(on disk)") < stdout.index(mine) < stdout.index(written)


def old_manifest(out: Path) -> None:
    """Make ``out`` what the parc before base texts wrote: no ``format``, no ``.parc/base/``."""
    manifest = out / ".parc" / "manifest.json"
    document = json.loads(manifest.read_text())
    del document["format"]
    manifest.write_text(json.dumps(document))
    for path in sorted((out / ".parc" / "base").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (out / ".parc" / "base").rmdir()


def test_a_manifest_without_bases_conflicts_with_a_clear_message(out, capsys):
    old_manifest(out)
    train = out / "train.py"
    mine = edit(train, MAIN, MAIN + NOTE)
    # The generation did not change train.py (the manifest's hash says so): fresh.
    assert run(capsys, *build("--check", out=out)) == (0, f"{out}: up to date\n{out}: edited, merges cleanly: train.py\n", "")
    status, _, err = run(capsys, *build("--set", "train.steps=7", "--check", out=out))
    assert status == 3 and (f"{out}: edited, no base to merge against: train.py (the folder was built by a parc "
                            "that kept no base texts in .parc/)\n") in err
    status, _, err = run(capsys, *build("--set", "train.steps=7", out=out))
    assert status == 3 and err.startswith(
        f"parc build: {out}/train.py differs from the new generation and cannot be merged: "
        f"the folder was built by a parc that kept no base texts in .parc/\n{out}/train.py:{DOC_STEPS}: (new generation: line {DOC_STEPS})\n"
        "<<<<<<< yours\n    --steps N              optimizer steps to run (default 20); the LR schedule\n=======\n"
        "    --steps N              optimizer steps to run (default 7); the LR schedule\n>>>>>>> new generation\n")
    assert "hint: edit your files so they merge, or run" in err and "--accept (yours kept as it is)" in err
    assert train.read_text() == mine
    # Without a base every difference is a conflict: two-way markers, resolved by taking the new lines.
    assert main(build("--set", "train.steps=7", "--write-conflicts", out=out)) == 3
    text = train.read_text()
    assert "<<<<<<< yours\n" + MAIN + "=======\n" not in text and "|||||||" not in text
    resolved = text.replace("<<<<<<< yours\n    --steps N              optimizer steps to run (default 20); the LR schedule\n=======\n", "")
    resolved = resolved.replace("<<<<<<< yours\nSTEPS = 20  # tiny.par:29\n=======\n", "")
    resolved = resolved.replace("<<<<<<< yours\n" + NOTE + "=======\n>>>>>>> new generation\n", NOTE)
    train.write_text(resolved.replace(">>>>>>> new generation\n", ""))
    assert main(build("--set", "train.steps=7", "--check", out=out)) == 0
    assert main(build("--set", "train.steps=8", out=out)) == 0  # merges against the recorded base now
    assert NOTE in train.read_text() and "STEPS = 8  # --set 1\n" in train.read_text()


def test_rebuilding_an_old_folder_with_the_same_spec_records_the_bases(out, capsys):
    old_manifest(out)
    train = out / "train.py"
    edit(train, MAIN, MAIN + NOTE)
    assert main(build(out=out)) == 0
    assert json.loads((out / ".parc" / "manifest.json").read_text())["format"] == 2
    assert main(build("--set", "train.steps=7", out=out)) == 0
    assert NOTE in train.read_text() and "STEPS = 7  # --set 1\n" in train.read_text()


def test_a_hostile_base_is_not_used(out, capsys, tmp_path):
    train = out / "train.py"
    edit(train, MAIN, MAIN + NOTE)
    base = out / ".parc" / "base" / "train.py"
    base.write_text("import os\nos.system('echo pwned')\n")  # not the manifest's sha256
    status, _, err = run(capsys, *build("--set", "train.steps=7", out=out))
    assert status == 3 and "its base text .parc/base/train.py does not match the manifest's sha256" in err
    base.unlink()
    os.mkfifo(base)  # a FIFO cannot hang the build
    status, _, err = run(capsys, *build("--set", "train.steps=7", out=out))
    assert status == 3 and "is not a regular file" in err
    base.unlink()
    base.symlink_to(tmp_path / "victim.txt")
    (tmp_path / "victim.txt").write_text("precious")
    for flags in ((), ("--force",), ("--check",), ("--accept",)):
        status, _, err = run(capsys, *build("--set", "train.steps=7", *flags, out=out))
        assert status == 1 and "leads outside the folder" in err and "Traceback" not in err
    assert (tmp_path / "victim.txt").read_text() == "precious"


def test_a_file_parc_no_longer_makes(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["build", TINY, "-o", str(out), "--set", "parallel.zero=1"]) == 0
    zero = out / "parc_runtime" / "parallel" / "data" / "zero.py"
    zero.write_text(zero.read_text() + "# mine\n")
    capsys.readouterr()
    status, stdout, _ = run(capsys, *build(out=out))
    assert status == 0 and f"{out}: left your parc_runtime/parallel/data/zero.py in place: parc no longer generates it, and it is yours now\n" in stdout
    assert zero.read_text().endswith("# mine\n") and not (out / ".parc" / "base" / "parc_runtime" / "parallel" / "data" / "zero.py").exists()
    assert run(capsys, *build("--check", out=out))[0] == 0


def test_an_unmanaged_folder_is_refused_unless_forced_and_then_backed_up(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.py").write_text("print('mine')\n")
    assert main(build(out=out)) == 1
    assert (out / "train.py").read_text() == "print('mine')\n"
    assert main(build("--force", out=out)) == 0
    assert (out / "train.py.orig").read_text() == "print('mine')\n"


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--force", "--accept"), "--force and --accept cannot go together: pick one way to resolve edits that do not merge"),
        (("--check", "--write-conflicts"), "--check writes nothing; it cannot go with --write-conflicts"),
        (("--diff", "--force"), "--diff writes nothing; it cannot go with --force"),
    ],
)
def test_usage_errors(out, capsys, flags, words):
    status, _, err = run(capsys, *build(*flags, out=out))
    assert (status, err) == (2, f"parc build: error: {words}\n")


def test_a_crash_is_not_a_conflict(out, capsys, monkeypatch):
    """Exit 3 means an edit does not merge; a bug in parc exits 70 (EX_SOFTWARE)."""
    import parc.codegen.build_merge as build_merge

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(build_merge, "plan_rebuild", broken)
    status, _, err = run(capsys, *build("--check", out=out))
    assert status == 70 and "internal error in parc (build): RuntimeError: boom" in err


def test_a_fifo_in_place_of_a_generated_file_does_not_hang_the_build(out, capsys):
    (out / "train.py").unlink()
    os.mkfifo(out / "train.py")
    for flags in ((), ("--check",), ("--force",)):
        status, _, err = run(capsys, *build(*flags, out=out))
        assert status == 1 and err.startswith(
            f"parc build: error: {out}/train.py is not a regular file (a device, pipe or socket): "
            "parc neither merges nor replaces it\nhint: move it aside")


def test_check_of_a_file_is_a_usage_error(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("mine")
    status, _, err = run(capsys, *build("--check", out=target))
    assert status == 2 and err.startswith(f"parc build: error: {target}: not a folder, nothing to check\n")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"format": 3}, "has format 3; this parc (0.1.0) reads format 2 at most"),
        ({"format": "2"}, "['format']: '2' is not of type 'integer'"),
        ({"files": {".parc/base/train.py": "0" * 64}}, "lists parc's own record '.parc/base/train.py' as a file"),
        ({"files": {".parc/manifest.json": "0" * 64}}, "lists parc's own record '.parc/manifest.json' as a file"),
    ],
)
def test_manifest_format_and_names_are_checked(out, capsys, change, words):
    manifest = out / ".parc" / "manifest.json"
    document = {**json.loads(manifest.read_text()), **change}
    manifest.write_text(json.dumps(document))
    before = snapshot(out)
    for flags in ((), ("--check",), ("--force",)):
        status, _, err = run(capsys, *build(*flags, out=out))
        assert status == 1 and words in err and "hint:" in err, err
    assert snapshot(out) == before
