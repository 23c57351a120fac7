"""Hostile inputs that need bytes or sizes tests/dsl/bad/ cannot hold: a file over
the size limit, /dev/zero, megabyte lines, a million comments, CR line endings;
and that the front end's work grows linearly (counted, not timed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parc.dsl import Diagnostics, load, load_text, parse, read_text
from parc.dsl.ast import strip_spans
from parc.dsl.diagnostics import ERROR_LIMIT, Span, render_all
from parc.dsl.fmt import format_document
from parc.dsl.source import MAX_SOURCE_BYTES, LineIndex

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "examples" / "tiny.par").read_text(encoding="utf-8")


def rendered(text: str, file: str = "t.par", overrides=()) -> str:
    with pytest.raises(Diagnostics) as caught:
        load_text(text, file, list(overrides))
    return render_all(caught.value.errors, caught.value.sources)


def test_a_file_over_the_limit_is_refused_after_reading_the_limit(tmp_path) -> None:
    path = tmp_path / "big.par"
    path.write_bytes(TINY.encode() + b"#" * (MAX_SOURCE_BYTES - len(TINY) + 1))
    with pytest.raises(Diagnostics) as caught:
        load(str(path))
    text = render_all(caught.value.errors, caught.value.sources)
    assert text == (
        f"{path}:1:1: error[PAR0018]: the file is larger than 16 MiB; parc reads specs up "
        "to that size\n  hint: is this the spec? a spec is a few hundred lines of text\n\n1 error\n"
    )


def test_a_file_at_the_limit_is_read(tmp_path) -> None:
    path = tmp_path / "full.par"
    filler = MAX_SOURCE_BYTES - len(TINY.encode())
    path.write_bytes(TINY.encode() + b"#" * (filler - 1) + b"\n")
    assert len(read_text(str(path)).encode()) == MAX_SOURCE_BYTES


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_devices_stop_at_the_limit(device: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "parc.codegen.cli", "check", device],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert "error[PAR0018]" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr) < 1000


def test_a_huge_set_argument_is_refused() -> None:
    text = rendered(TINY, "tiny.par", ["model.name=" + "x" * (MAX_SOURCE_BYTES + 1)])
    assert "--set 1:1:1: error[PAR0018]: the argument is larger than 16 MiB" in text
    assert len(text) < 1000


def test_a_long_set_value_is_quoted_clipped() -> None:
    text = rendered(TINY, "tiny.par", ["model.layers=" + "9" * 1_000_000])
    assert "error[PAR0011]: number `" in text and "is too long" in text
    assert len(text) < 1000


def test_a_megabyte_line_is_quoted_around_the_caret() -> None:
    line = "  layers = " + "1" * 10 + " " + "x" * 1_000_000
    text = rendered(TINY.replace("  layers = 4", line))
    assert len(text) < 1000
    assert "…" in text


def test_a_caret_deep_in_a_long_line_stays_under_its_text() -> None:
    text = rendered(TINY.replace("  layers = 4", "  layers = 4" + " " * 500 + "; "))
    quoted, caret = [l for l in text.splitlines() if " | " in l][:2]
    assert quoted.index(";") == caret.index("^")
    assert quoted.split(" | ", 1)[1].startswith("…")


def _unknown_keys(count: int) -> str:
    """TINY with ``count`` unknown keys in its train block: as many errors."""
    return TINY.replace("  steps = 20\n", "  steps = 20\n" + "".join(f"  unknown_{i} = 1\n" for i in range(count)))


def test_many_errors_share_one_line_index() -> None:
    before = LineIndex.built
    text = _unknown_keys(2000)
    with pytest.raises(Diagnostics) as caught:
        load_text(text, "t.par")
    everything = render_all(caught.value.errors, caught.value.sources, limit=None)
    assert everything.count("error[PAR0104]") == 2000
    assert LineIndex.built - before <= 3  # parse, the SourceMap of load: not one per error


def test_past_the_error_limit_one_line_counts_the_rest() -> None:
    out = rendered(_unknown_keys(ERROR_LIMIT + 1234))
    assert out.count("error[PAR0104]") == ERROR_LIMIT
    assert out.count("\n\n") == ERROR_LIMIT  # after each shown error, and nowhere else
    assert out.endswith(
        f"\n\n… and 1,234 more errors not shown (parc prints the first {ERROR_LIMIT})\n"
        f"{ERROR_LIMIT + 1234} errors\n"
    )
    first_shown = out.index("t.par:30:3: error[PAR0104]")  # the first unknown key, by position
    assert first_shown == 0


def test_duplicates_of_a_key_past_ten_are_one_error() -> None:
    """A key set 714,286 times (a 10 MB file) was 714,285 errors, made, sorted and counted one by one
    (19 s): the first ten duplicates are shown, the rest counted in one error at the eleventh."""
    text = TINY.replace("  steps = 20\n", "  steps = 20\n" * 26)
    out = rendered(text)
    assert out.count("error[PAR0105]") == 11
    assert "t.par:30:3: error[PAR0105]: duplicate key `steps` (first set on line 29)" in out
    assert out.endswith(
        "t.par:40:3: error[PAR0105]: duplicate key `steps` set 15 more times, on lines 40 to 54 (first set on "
        "line 29)\n  40 |   steps = 20\n     |   ^^^^^\n  hint: remove them: a key is set once a block (the first "
        "10 duplicates are shown above)\n\n11 errors\n")


def test_counted_duplicates_give_the_same_errors_and_fmt_keeps_every_line() -> None:
    """Note [duplicates counted]: a check builds the first duplicates and one entry for the
    last, counting those between; the errors are those of a full build, and the fmt parse
    (which writes lines back) builds every entry."""
    from parc.dsl.diagnostics import DUPLICATES_SHOWN

    text = TINY.replace("  steps = 20\n", "  steps = 20\n" + "  steps = 21\n" * 40 + "  steps = 22\n")
    out = rendered(text)
    assert "duplicate key `steps` set 31 more times, on lines 40 to 70 (first set on line 29)" in out
    train = [item for item in parse(text, "t.par", comments=False).items if item.kind == "train"][0]
    steps = [e for e in train.entries if e.key == "steps"]
    assert len(steps) == 1 + DUPLICATES_SHOWN + 2 and steps[-1].repeated == 41 - (DUPLICATES_SHOWN + 2)
    assert steps[-1].key_span.line == 70 and steps[-1].value.value == 22  # the last, with its own value
    kept = parse(text, "t.par")  # with comments: the parse parc fmt writes back
    train = [item for item in kept.items if item.kind == "train"][0]
    assert sum(e.key == "steps" for e in train.entries) == 42
    assert format_document(kept).count("steps = 21") == 40


def test_equal_lines_lex_as_each_alone() -> None:
    """Note [lexed lines]: the words of a line seen before are reused at the new line and
    column; lines with strings, comments or brackets are lexed each time."""
    from parc.dsl import quick_parse

    text = TINY + "".join(f"model m{i} {{\n  layers = 2\n  hidden = 64  # c\n  name = \"x\"\n}}\n" for i in range(3))
    limit = quick_parse.LINES_CACHED
    try:
        cached = quick_parse._lex(text, None)
        quick_parse.LINES_CACHED = 0
        assert quick_parse._lex(text, None) == cached
    finally:
        quick_parse.LINES_CACHED = limit


def test_a_list_past_the_limit_is_refused_before_its_values_are_read() -> None:
    """A per-layer list of a million values took ~10 s (each value normalized, then checked by the
    schema): past LIST_MAX (the most layers) it is one error, and its values are not looked at."""
    from parc.dsl.normalize import LIST_MAX, normalize_document

    values = "[" + ", ".join(["full"] * (LIST_MAX + 1)) + "]"
    text = TINY.replace("  pp = 1\n", f"  pp = 1\n  recompute = {values}\n")
    norm = normalize_document(parse(text, "t.par"))
    assert [e.code for _, e in norm.errors] == ["PAR0116"]
    assert not [path for path in norm.origins if path[:2] == ("parallel", "recompute") and len(path) > 2]
    assert rendered(text).startswith(
        "t.par:24:15: error[PAR0116]: `parallel.recompute` has 10,001 values, but a list holds at most 10,000\n")
    ok = values.replace("full, ", "", 1)  # LIST_MAX values: read, and then too many for 4 layers
    assert "error[PAR0116]: `parallel.recompute` lists 10000 values but the model has layers = 4" in rendered(
        TINY.replace("  pp = 1\n", f"  pp = 1\n  recompute = {ok}\n"))


def test_a_million_comments_parse_and_format_back() -> None:
    text = TINY + "\n" + "".join(f"# {i}\n" for i in range(200_000))
    before = LineIndex.built
    doc = parse(text, "c.par")
    assert len(doc.comments) == 200_000 + 3
    assert doc.comments[-1].span == Span(
        file="c.par", line=text.count("\n"), column=1, end_line=text.count("\n"), end_column=9
    )
    assert format_document(doc) == text
    assert LineIndex.built - before == 1


def test_fast_spans_equal_the_plain_constructor() -> None:
    fast = Span.on_line("f", 3, 4, 9)
    assert fast == Span(file="f", line=3, column=4, end_line=3, end_column=9)
    assert hash(fast) == hash(Span(file="f", line=3, column=4, end_line=3, end_column=9))
    with pytest.raises(AttributeError):
        fast.line = 1  # frozen still


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"])
def test_every_newline_convention_reads_the_same(newline: str) -> None:
    text = TINY.replace("\n", newline)
    assert load_text(text, "t.par") == load_text(TINY, "t.par")
    assert strip_spans(parse(text, "t.par")) == strip_spans(parse(TINY, "t.par"))
    assert format_document(parse(text, "t.par")) == TINY


def test_a_cr_file_error_quotes_its_own_line() -> None:
    text = TINY.replace("  tp = 2", "  tp = 3").replace("\n", "\r")
    out = rendered(text)
    assert "t.par:22:8: error[PAR0203]" in out and "  22 |   tp = 3\n" in out


def test_mixed_newlines_count_lines_alike() -> None:
    text = TINY.replace("\n", "\r", 5).replace("\n", "\r\n", 5).replace("  tp = 2", "  tp = 3")
    assert "t.par:22:8: error[PAR0203]" in rendered(text)


def test_not_utf8_after_cr_lines_points_at_the_byte(tmp_path) -> None:
    path = tmp_path / "b.par"
    path.write_bytes(b"# a\r# b\r\n  x = \xff\n")
    with pytest.raises(Diagnostics) as caught:
        load(str(path))
    assert str(caught.value.errors[0].span) == f"{path}:3:7"


@pytest.mark.parametrize("byte", [b"\x00", b"\x01", b"\x1b", b"\x7f"])
def test_control_bytes_are_refused_anywhere(byte: bytes) -> None:
    for where in ("# comment X\n", '  data = tokens("aXb")\n'):
        text = TINY.replace("  steps = 20\n", "  steps = 20\n" + where.replace("X", byte.decode()))
        out = rendered(text)
        assert "error[PAR0002]: unexpected control character" in out
        assert byte.decode() not in out


def test_json_and_par_refuse_the_same_numbers() -> None:
    doc = json.loads(json.dumps({}))
    for bad in ("1e400", "1" * 200, "NaN", "-Infinity"):
        text = (ROOT / "tests/dsl/bad/json-semantic.json").read_text().replace('"tp": 3', f'"tp": {bad}')
        out = rendered(text, "s.json")
        assert "Traceback" not in out and ("PAR0011" in out or "PAR0016" in out), out
    assert doc == {}


def test_deep_json_is_refused_at_its_bracket() -> None:
    text = '{"model": ' + "[" * 10_000 + "]" * 10_000 + "}"
    out = rendered(text, "d.json")
    assert "d.json:1:" in out and "error[PAR0010]: brackets nested too deeply" in out


def test_a_json_bom_is_a_blank() -> None:
    text = json.dumps({"model": {"name": "m"}})
    with_bom, without = rendered("\ufeff" + text, "b.json"), rendered(" " + text, "b.json")
    assert with_bom.splitlines()[0] == without.splitlines()[0]
    assert with_bom.count("error[") == without.count("error[") > 0


def test_a_set_argument_with_a_cr_is_not_block_key_value() -> None:
    out = rendered(TINY, "tiny.par", ["train.steps=2\r0"])
    assert "--set 1:1:1: error[PAR0017]" in out and "\r" not in out


def test_the_count_line_tells_errors_from_warnings() -> None:
    from parc.dsl.diagnostics import ParcError, Severity, SourceMap

    span = Span.on_line("t.par", 1, 1, 2)
    error = ParcError(span=span, code="PAR0201", message="e")
    warning = ParcError(span=span, code="PAR0218", message="w", severity=Severity.WARNING)
    sources = SourceMap()
    assert render_all([warning], sources) == "t.par:1:1: warning[PAR0218]: w\n\n1 warning\n"
    assert render_all([error, warning, warning], sources).endswith("\n1 error, 2 warnings\n")
    assert render_all([error, warning], sources, limit=1).endswith(
        "… and 1 more diagnostic not shown (parc prints the first 1)\n1 error, 1 warning\n"
    )


def test_set_default_takes_a_key_back_out() -> None:
    """``--set KEY=default``: the key as if the file did not write it; a key without a
    default says so at the argument."""
    spec = load_text(TINY.replace("  steps = 20\n", "  steps = 20\n  seed = 7\n"), "t.par", ["train.seed=default"])
    assert spec.train.seed == load_text(TINY, "t.par").train.seed
    out = rendered(TINY, overrides=["model.layers=default"])
    assert "--set 1:1:14: error[PAR0115]: `model.layers` has no default to go back to" in out
