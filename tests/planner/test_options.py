"""The planner's layout options are entries (cost/options.py, Note [an option is an entry]):
the generic planner files loop over them and name none, and their words print where the
if-chains printed them."""

from __future__ import annotations

import re
from pathlib import Path

from parc.codegen.layout_words import Words, words
from parc.codegen.planner.cost import Layout
from parc.codegen.planner.cost.options import options, qualified

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("codegen/planner/cost/time.py", "codegen/planner/cost/memory.py", "codegen/planner/why.py",
           "codegen/planner/search.py", "codegen/cli/plan.py", "codegen/cli/explain.py", "codegen/layout_words.py",
           "codegen/gantt.py", "codegen/planner/cost/bubble.py")
"""The planner's files that loop over the entries and call the owners' hooks (bubble.py: the
schedule table's, ``runtime/schedules/schedule.words`` and ``OWN_CLOSED_FORM``)."""
FEATURE_WORDS = ("terapipe", "chimera", "compress_pp", "zero_shard")
"""Words of issue 32 whose facts live in the cost modules (slices.py, compress.py), the schedules'
modules and ``cost/layout.py``."""


def test_no_generic_planner_file_names_an_option():
    names = {entry.name for entry in options()} | set(FEATURE_WORDS)
    named = {
        path: sorted(name for name in names if re.search(rf"\b{name}\b", (ROOT / path).read_text(encoding="utf-8")))
        for path in GENERIC
    }
    assert not {path: found for path, found in named.items() if found}, "use the option's entry or its owner's hook"


def test_each_option_prints_after_its_axis_or_after_ep():
    layout = Layout(dp=1, tp=4, pp=1, sp=False, zero=0, schedule="1f1b", chunks=1, micro_batch=1, cp=2,
                    cp_kind="ulysses", tp_shape=(2, 2), ep=2, etp=2)
    assert qualified(layout, "cp") == " (ulysses)" and qualified(layout, "tp") == " (2×2)"
    assert layout.describe() == "dp 1 cp 2 (ulysses) tp 4 (2×2) pp 1 ep 2 etp 2"
    text = words(Words(degrees={"cp": 2, "tp": 4}, options={"tp_shape": (2, 2)}, ep=2))
    assert text == "cp 2 (ring) × tp 4 (2×2) + ep 2", "an option left out of Words takes its entry's default"


def test_the_planner_cites_the_auto_of_every_key_it_fills():
    """passes/choose_layout.py's ``PLANNED_KEYS`` takes the options a spec may leave auto
    from their entries (``Option.auto``: tp_shape, etp), and lists compression beside the
    degrees: a build cites the spec's ``compress = auto`` and ``tp_shape = auto`` as planned
    (before, neither was among the keys, so their spans were not marked)."""
    from parc.codegen.passes.choose_layout import PLANNED_KEYS, _planned_spans
    from parc.dsl import load

    planned = {f"parallel.{entry.name}" for entry in options() if entry.auto is not None}
    assert planned == {"parallel.tp_shape", "parallel.etp"} and planned <= set(PLANNED_KEYS)
    spec = load(str(ROOT / "tests/planner/specs/commodity.par"), buildable=False)  # compress = auto
    assert spec.parallel.compress is None and dict(_planned_spans(spec))["parallel.compress"].planned
    spec = load(str(ROOT / "examples/tiny.par"), ["parallel.tp=auto", "parallel.tp_shape=auto"], buildable=False)
    spans = dict(_planned_spans(spec))
    assert spans["parallel.tp_shape"].planned and spans["parallel.tp"].planned
