"""A per-layer setting is an entry (Note [a per-layer setting is an entry]).

The generic stages — spec, plan, renderer, plan text, search, why lines, JSON —
reach a setting through ``runtime/layer_settings.SETTINGS``; only the files that own
the setting's language, rules, runtime work and cost name it. Overlap's own word
(``sub_batch``) stands for every setting here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from parc.codegen.planner.cost.layout import Layout
from parc.dsl import load
from parc.runtime.layout.layer_settings import SETTINGS, setting, shown, words

ROOT = Path(__file__).resolve().parents[1]

OWNERS = {
    "dsl/keys/parallel.py",  # the language: overlap = sub_batch(k)
    "runtime/layout/layer_settings.py",  # the entry
    "runtime/layout/constraints/rules_overlap.py",  # its rules (PAR0211, PAR0215)
    "runtime/parallel/tensor/overlap.py",  # the Oases wavefront
    "codegen/planner/cost/overlap.py",  # its cost term
}


def test_one_setting_is_named_in_six_files():
    listed = subprocess.run(
        ["git", "grep", "-l", "sub_batch", "--", ".", ":!tests", ":!docs", ":!bench", ":!README.md"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    if listed.returncode not in (0, 1):  # not a git checkout: walk the files instead
        found = {
            str(path.relative_to(ROOT))
            for folder in ("codegen", "dsl", "runtime", "templates")
            for path in (ROOT / folder).rglob("*")
            if path.is_file() and path.suffix in (".py", ".j2", ".lark") and "sub_batch" in path.read_text()
        }
    else:
        found = set(listed.stdout.split())
    assert found <= OWNERS, f"sub_batch named outside its owners: {sorted(found - OWNERS)}"
    assert len(found) <= 6


def test_every_setting_is_a_field_of_the_spec_the_plan_and_the_cost_layout():
    from parc.codegen.plan import LayerLayout
    from parc.dsl.spec import ParallelSpec

    for entry in SETTINGS:
        for holder in (ParallelSpec, LayerLayout, Layout):
            assert entry.name in holder.__dataclass_fields__, (entry.name, holder.__name__)


def test_words_fold_runs_and_leave_off_values_out():
    overlap, recompute = setting("overlap"), setting("recompute")
    assert words(overlap, 1) is None and words(recompute, "none") is None
    assert words(overlap, 2) == "sub_batch(2)"
    assert words(recompute, ("full", "full", "none")) == "[full ×2, none]"
    assert shown(recompute, "full", "rc:") == "rc:full"
    assert shown(overlap, 4, "overlap:") == "sub_batch(4)"  # names itself
    assert shown(overlap, (2, 1), "overlap:") == "overlap:[sub_batch(2), none]"


def test_the_spec_reads_and_writes_settings_as_plain_values():
    spec = load(str(ROOT / "examples" / "tiny.par"),
                ["parallel.recompute=[full, none, selective, none]", "parallel.overlap=sub_batch(2)"])
    par = spec.parallel
    assert par.setting("recompute") == ("full", "none", "selective", "none")
    assert par.layer_values("overlap", 4) == (2, 2, 2, 2)
    back = par.with_settings({"recompute": ("none",) * 4, "overlap": 1})
    assert back.setting("recompute") == ("none",) * 4 and back.overlap == 1
    assert back.recompute[0] is type(par.recompute[0]).NONE  # the spec keeps its enum
