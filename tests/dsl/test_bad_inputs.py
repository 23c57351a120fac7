"""Every file in tests/dsl/bad/ is a spec with mistakes; NAME.out is the exact text
``parc check`` prints for it (diagnostics as rendered, no colour).

The first line of a case says what it shows; ``# set: KEY=VALUE`` lines below it are
``--set`` arguments, applied in order. To regenerate the expected texts after a
deliberate change: ``PARC_UPDATE_GOLDEN=1 pytest tests/dsl/test_bad_inputs.py``, then
read the diff.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from parc.dsl import Diagnostics, load_text
from parc.dsl.diagnostics import render_all

CASES = Path(__file__).parent / "bad"
FILES = sorted(p for p in CASES.iterdir() if p.suffix in (".par", ".json"))
UPDATE = os.environ.get("PARC_UPDATE_GOLDEN") == "1"


def overrides_of(text: str) -> list[str]:
    return re.findall(r"^# set: (.*)$", text, flags=re.M)


def rendered(path: Path) -> str:
    """A case's files (a token file's record in ``data/``) are found from its folder."""
    text = path.read_text(encoding="utf-8")
    try:
        with contextlib.chdir(CASES):
            load_text(text, path.name, overrides_of(text))
    except Diagnostics as exc:
        return render_all(exc.errors, exc.sources)
    return "(no errors)\n"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_bad_input_renders_exactly(path: Path) -> None:
    expected_path = path.with_suffix(".out")
    actual = rendered(path)
    if UPDATE:
        expected_path.write_text(actual, encoding="utf-8")
    assert actual != "(no errors)\n", f"{path.name} has no error"
    assert actual == expected_path.read_text(encoding="utf-8")


def test_there_are_enough_cases() -> None:
    assert len(FILES) >= 40


def test_every_error_code_has_a_case() -> None:
    """Each code of docs/language.md's table appears in some expected output."""
    outputs = "".join(p.read_text(encoding="utf-8") for p in CASES.glob("*.out"))
    docs = (Path(__file__).parents[2] / "docs" / "language.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| (PAR\d{4}) \|", docs, flags=re.M))
    build_only = set(re.findall(r"^\| (PAR\d{4}) \| \(parc build only\)", docs, flags=re.M))
    warnings = set(re.findall(r"^\| (PAR\d{4}) \| \(warning\)", docs, flags=re.M))  # tests/dsl/test_cli.py
    assert documented, "docs/language.md has no error table"
    seen = set(re.findall(r"error\[(PAR\d{4})\]", outputs))
    # not-UTF-8 needs bytes (test_parse.py), too-large a 16 MiB file (test_hardening.py);
    # build-only codes: tests/codegen
    untested = documented - seen - build_only - warnings - {"PAR0001", "PAR0018"}
    assert not untested, f"codes without a case in tests/dsl/bad: {sorted(untested)}"
    assert seen <= documented, f"codes missing from docs/language.md: {sorted(seen - documented)}"
