"""The search: the validator's layouts exactly, deterministic, --set fixes a key, the
bubble from the runtime's schedules, the calibration rows, the build's winner."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.planner.cost import Accounting, Layout, estimate, hardware_for
from parc.codegen.planner.cost.estimate import buildable
from parc.codegen.planner.cost.bubble import _simulate, makespan
from parc.codegen.planner.cost.calibration import predicted_tflops
from parc.codegen.build import build_to
from parc.codegen.lower import lower
from parc.codegen.planner.why import why
from parc.codegen.planner.search import EXACT_TOP, TIE_TOLERANCE, candidates, rank, search, tie_memory_unit, tie_rule
from parc.dsl import load
from parc.dsl.diagnostics import Diagnostics
from parc.runtime.schedules.schedule import build_schedule
from parc.runtime.schedules.schedule_sim import simulate

# a copy of ../shared/reference/megatron_sc21_calibration.json (Megatron-LM SC21, Table 1),
# kept in the repository so the test does not depend on what lies beside the clone
CALIBRATION = Path(__file__).parent / "data" / "megatron_sc21_calibration.json"


def _key(layout: Layout):
    return (layout.dp, layout.tp, layout.pp, layout.sp, layout.zero, layout.schedule, layout.chunks,
            layout.slices, layout.recompute, layout.overlap)


def _schedule_text(kind: str, chunks: int, slices: int) -> str:
    """The spec's spelling of a (kind, chunks, slices) schedule."""
    if kind == "interleaved":
        return f"interleaved(chunks = {chunks})"
    return f"terapipe(slices = {slices})" if kind == "terapipe" else kind


SCHEDULES = (("1f1b", 1, 1), ("gpipe", 1, 1), ("interleaved", 2, 1), ("interleaved", 4, 1), ("zero_bubble", 1, 1),
             ("zero_bubble_v", 2, 1), ("chimera", 2, 1), ("terapipe", 1, 2), ("terapipe", 1, 4), ("terapipe", 1, 8))
"""What ``schedule = auto`` tries (runtime/layouts.schedules), interleaved up to 4 chunks, as
(kind, the chunks a rank runs, slices)."""


def _accepted_by_validator(path: str, base: list[str]) -> set:
    """Every layout of the grid that ``parc.dsl`` and the build's mesh rule accept."""
    accepted = set()
    grid = itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), (False, True), (0, 1),
        SCHEDULES, (1, 2),
    )
    for dp, tp, pp, sp, zero, (kind, chunks, slices), subs in grid:
        if dp * tp * pp != 8:
            continue  # the world: PAR0201 (the candidates fill the mesh by construction)
        schedule = _schedule_text(kind, chunks, slices)
        sets = base + [
            f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.sp={str(sp).lower()}",
            f"parallel.zero={zero}", f"parallel.schedule={schedule}", "parallel.recompute=none",
            f"parallel.overlap={'none' if subs == 1 else f'sub_batch({subs})'}",
        ]
        try:
            spec = load(path, sets)
        except Diagnostics:
            continue
        mesh = spec.mesh
        if mesh.nodes > 1 and mesh.devices_per_node % tp:
            continue  # resolve_mesh: a tp group stays on one node
        # Same program as a listed layout (Note [the search space]): not enumerated.
        if (zero and dp == 1) or (subs > 1 and tp == 1) or (kind != "1f1b" and pp == 1):
            continue
        accepted.add((dp, tp, pp, sp, zero, kind, chunks, slices, "none", subs))
    return accepted


def test_candidates_are_the_validators_layouts():
    base = ["parallel=auto", "parallel.recompute=none", "mesh.devices_per_node=8", "train.global_batch=32",
            "train.micro_batch=2"]
    spec = load("examples/tiny.par", base)
    # the build rules do not filter candidates (the search marks them unbuildable); parc check refuses them
    found = {_key(layout) for layout in candidates(spec) if layout.zero <= 1 and buildable(spec, layout)}
    assert found == _accepted_by_validator("examples/tiny.par", base)
    assert len(found) > 50


def test_micro_batch_auto_searches_every_divisor_the_validator_accepts():
    base = ["parallel=auto", "parallel.recompute=none", "parallel.zero=0", "train.micro_batch=auto",
            "mesh.devices_per_node=4", "train.global_batch=16"]
    spec = load("examples/tiny.par", base)
    layouts = candidates(spec)
    found = {(lay.dp, lay.pp, lay.micro_batch) for lay in layouts if lay.tp == 1}
    # dp·pp = 4; micro_batch divides 16 / dp with at least pp micro-batches
    assert found == {(4, 1, 1), (4, 1, 2), (4, 1, 4), (2, 2, 1), (2, 2, 2), (2, 2, 4),
                     (1, 4, 1), (1, 4, 2), (1, 4, 4)}
    for lay in layouts:  # each buildable one is a spec the language accepts
        if not buildable(spec, lay):
            continue
        load("examples/tiny.par", [
            f"parallel.dp={lay.dp}", f"parallel.tp={lay.tp}", f"parallel.pp={lay.pp}",
            f"parallel.sp={str(lay.sp).lower()}", "parallel.recompute=none", "parallel.zero=0",
            f"parallel.overlap={'none' if lay.overlap == 1 else f'sub_batch({lay.overlap})'}",
            f"parallel.schedule={_schedule_text(lay.schedule, lay.chunks, lay.slices)}",
            f"train.micro_batch={lay.micro_batch}", "mesh.devices_per_node=4", "train.global_batch=16",
        ])
    winner = search(spec, hardware_for(spec)).winner.layout
    built = lower(spec)
    assert built.batch.micro_batch == winner.micro_batch
    assert built.batch.micro_batch * built.batch.grad_accum * winner.dp == 16


def test_planned_values_cite_the_auto_they_replace(tmp_path):
    spec_path = tmp_path / "auto.par"
    text = Path("examples/tiny.par").read_text()
    text = text.replace("micro_batch = 2", "micro_batch = auto")
    text = text[: text.index("parallel {")] + "parallel = auto\n" + text[text.index("train {"):]
    spec_path.write_text(text)
    line_of = {word: 1 + text[: text.index(word)].count("\n") for word in ("parallel = auto", "micro_batch")}
    out = build_to(spec_path, tmp_path / "build")
    train_py = (out / "train.py").read_text()
    assert "DP = " in train_py
    for name in ("DP", "TP"):
        line = next(row for row in train_py.splitlines() if row.startswith(f"{name} = "))
        assert f"# auto.par:{line_of['parallel = auto']} (planner):" in line, line
    line = next(row for row in train_py.splitlines() if row.startswith("MICRO_BATCH = "))
    assert f"# auto.par:{line_of['micro_batch']} (planner)" in line, line
    assert "cited `(planner)`" in train_py
    # a key fixed by --set stays the user's
    out = build_to(spec_path, tmp_path / "fixed", ["parallel.tp=2"])
    line = next(row for row in (out / "train.py").read_text().splitlines() if row.startswith("TP = "))
    assert "--set 1:" in line and "(planner)" not in line, line


def test_search_is_deterministic_and_ranked():
    spec = load("examples/gpt2-small.par", ["parallel=auto"])
    hw = hardware_for(spec)
    first, second = search(spec, hw), search(spec, hw)
    assert [_key(e.layout) for e in first.estimates] == [_key(e.layout) for e in second.estimates]
    head = [e.time.step for e in first.estimates[:EXACT_TOP] if e.fits]  # scored exactly
    assert all(a <= b * (1 + TIE_TOLERANCE) for a, b in zip(head, head[1:]))
    # the uniform candidates, and the per-layer program's and mixed recompute's layouts
    assert first.considered == len(first.estimates) >= len(candidates(spec)) > 100


def _with(item, step: float, peak: float):
    memory = replace(item.memory, params=peak, grads=0.0, optimizer=0.0, activations=0.0, buffers=0.0)
    return replace(item, time=replace(item.time, step=step), memory=memory)


def test_near_ties_go_to_memory_then_the_simpler_program_never_past_a_faster_layout():
    spec = load("examples/gpt2-small.par", ["parallel=auto"])
    hw = hardware_for(spec)
    by_layout = {(e.layout.dp, e.layout.tp, e.layout.pp, e.layout.zero): e for e in search(spec, hw).estimates
                 if e.layout.recompute == "none" and not e.layout.sp and e.layout.overlap == 1
                 and e.layout.schedule == "1f1b" and e.layout.micro_batch == spec.train.micro_batch}
    big, small = 8 * 2**30, 2**30
    fast_big = _with(by_layout[(8, 1, 1, 0)], 1.000, big)
    tied_small = _with(by_layout[(4, 2, 1, 0)], 1.004, small)  # within 0.5% of the fastest: wins on memory
    tied_simple = _with(by_layout[(8, 1, 1, 1)], 1.0045, big)  # same memory step as fast_big, zero 1
    slow_small = _with(by_layout[(2, 4, 1, 0)], 1.006, small)  # 0.6% slower than fast_big: never above it
    ranked = rank([slow_small, tied_simple, fast_big, tied_small], tie_memory_unit(hw))
    # the window is anchored at the fastest layout not yet placed: with fast_big placed,
    # slow_small is within 0.5% of tied_simple and beats it on memory
    assert [e.layout for e in ranked] == [e.layout for e in (tied_small, fast_big, slow_small, tied_simple)]
    assert tie_rule(tied_small, fast_big, tie_memory_unit(hw)) == "lower peak memory"
    assert tie_rule(fast_big, tied_simple, tie_memory_unit(hw)) == "lower ZeRO stage"
    for i, a in enumerate(ranked):
        assert all(a.time.step <= b.time.step * (1 + TIE_TOLERANCE) for b in ranked[i + 1:])


@pytest.mark.parametrize("key,value,attribute,expected", [
    ("parallel.tp", "4", "tp", 4),
    ("parallel.zero", "1", "zero", 1),
    ("parallel.recompute", "full", "recompute", "full"),
    ("parallel.schedule", "gpipe", "schedule", "gpipe"),
])
def test_set_fixes_one_key_of_an_auto_block(key, value, attribute, expected):
    spec = load("examples/gpt3-175b.par", [f"{key}={value}"])
    layouts = candidates(spec)
    assert layouts and all(getattr(layout, attribute) == expected for layout in layouts)
    free = {layout.dp for layout in layouts}
    assert len(free) > 1  # the other keys are still searched


def test_build_winner_is_buildable_and_recorded():
    spec = load("examples/tiny.par", ["parallel=auto"])
    result = search(spec, hardware_for(spec))
    plan = lower(spec)
    winner = result.winner.layout
    assert result.winner.buildable
    assert plan.mesh.size(plan.mesh.axes[1].axis) == winner.dp  # axes: pp, dp, tp
    assert plan.predicted is not None and plan.predicted.layouts_considered == result.considered
    assert json.loads(plan.to_json())["predicted"]["step_time_s"] == pytest.approx(result.winner.time.step, rel=1e-5)
    fixed = lower(load("examples/tiny.par"))
    assert fixed.predicted is None and "predicted" not in json.loads(fixed.to_json())


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", [
    ("1f1b", 4, 8, 1), ("gpipe", 4, 6, 1), ("interleaved", 4, 8, 2), ("1f1b", 2, 2, 1),
    # zero_bubble's closed form is the paper's, exact for B = W <= F (backward <= 2F);
    # beyond that it is an estimate that the exact re-scoring replaces
    ("zero_bubble", 4, 8, 1), ("zero_bubble", 2, 2, 1), ("zero_bubble", 8, 16, 1),
])
def test_closed_form_is_the_simulated_schedule_without_comm(kind, stages, micro_batches, chunks):
    backward = 2.0 if kind == "zero_bubble" else 2.5
    timeline = simulate(build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks),
                        forward_time=1.0, backward_time=backward)
    fast = makespan(kind, stages=stages, micro_batches=micro_batches, chunks=chunks,
                    forward=1.0, backward=backward, comm=0.0, exact=False)
    assert fast == pytest.approx(timeline.makespan, rel=1e-12)


@pytest.mark.parametrize("kind,stages,micro_batches,slices", [
    # chimera: each micro-batch through one of a rank's two chunks, (p-2)·B idle when p divides M
    ("chimera", 2, 4, 1), ("chimera", 4, 8, 1), ("chimera", 8, 16, 1),
    # terapipe: F, B of one slice; 1F1B's form over M·S slices
    ("terapipe", 2, 4, 2), ("terapipe", 4, 8, 4), ("terapipe", 8, 5, 8),
])
def test_chimera_and_terapipe_closed_forms_are_their_simulated_schedules(kind, stages, micro_batches, slices):
    chunks = 2 if kind == "chimera" else 1
    schedule = build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks, slices=slices)
    timeline = simulate(schedule, forward_time=1.0 / slices, backward_time=2.0 / slices)
    fast = makespan(kind, stages=stages, micro_batches=micro_batches, chunks=chunks, slices=slices,
                    forward=1.0 / slices, backward=2.0 / slices, comm=0.0, exact=False)
    assert fast == pytest.approx(timeline.makespan, rel=1e-12)
    exact = makespan(kind, stages=stages, micro_batches=micro_batches, chunks=chunks, slices=slices,
                     forward=1.0 / slices, backward=2.0 / slices, comm=0.0, exact=True)
    assert exact == pytest.approx(timeline.makespan, rel=1e-12)


def test_schedule_auto_tries_every_schedule_and_says_why_the_winner_won():
    spec = load("examples/tiny.par", ["parallel.dp=1", "parallel.pp=2", "parallel.schedule=auto"])
    kinds = {(layout.schedule, layout.chunks, layout.slices) for layout in candidates(spec)}
    assert kinds == {("1f1b", 1, 1), ("gpipe", 1, 1), ("interleaved", 2, 1), ("zero_bubble", 1, 1),
                     ("zero_bubble_v", 2, 1), ("chimera", 2, 1), ("terapipe", 1, 2), ("terapipe", 1, 4),
                     ("terapipe", 1, 8)}  # seq_len 64: every S of layouts.SLICES divides it
    hw = hardware_for(spec)
    result = search(spec, hw)
    by_schedule = {}
    for item in result.estimates:
        by_schedule.setdefault(item.layout.schedule_words, item)
    # the same simulator as the runtime's lists: every schedule of the same degrees has
    # the same busy time but chimera (two replicas) and terapipe (S smaller pieces)
    assert by_schedule["zero_bubble"].time.bubble < by_schedule["1f1b"].time.bubble
    assert by_schedule["terapipe(8)"].time.bubble < by_schedule["terapipe(2)"].time.bubble
    winner = result.winner.layout
    lines = why(spec, result, hw)
    assert winner.schedule != "1f1b" and winner.schedule_words in lines[0]
    assert "schedule" in lines[0] or "slices" in lines[0]


@pytest.mark.parametrize("kind,stages,micro_batches,chunks,comm", [
    ("1f1b", 4, 40, 1, 0.1), ("interleaved", 4, 40, 2, 0.3), ("gpipe", 3, 20, 1, 0.2), ("1f1b", 8, 48, 1, 0.05),
    ("zero_bubble", 4, 40, 1, 0.1), ("zero_bubble", 2, 24, 1, 0.0),
])
def test_steady_state_extension_is_the_full_simulation(kind, stages, micro_batches, chunks, comm):
    """(zero_bubble rows too: its period is p micro-batches as well)"""
    exact = makespan(kind, stages=stages, micro_batches=micro_batches, chunks=chunks,
                     forward=2.0, backward=4.4, comm=2.0 * comm, exact=True)
    full = 2.0 * _simulate(kind, stages, micro_batches, chunks, 2.2, comm)
    assert exact == pytest.approx(full, rel=1e-9)


def test_megatron_rows_within_ten_percent():
    """SC21 Table 1 rows, a100-80gb with the fitted efficiency (bench/planner_calibration.py)."""
    with open(CALIBRATION, encoding="utf-8") as handle:
        rows = json.load(handle)["rows"]
    for row in rows:
        predicted = predicted_tflops(row)
        assert predicted == pytest.approx(row["tflops_per_gpu"], rel=0.10), (row["model_label"], predicted)


def test_zero3_is_built_and_zero3_with_compression_predicted_but_never_the_winner():
    spec = load("examples/gpt3-175b.par", ["parallel.zero=3"])  # runtime/parallel/data/fsdp.py builds it
    result = search(spec, hardware_for(spec))
    assert result.winner is not None and result.winner.layout.zero == 3
    unbuilt = ["parallel.zero=3", "parallel.compress=powersgd(rank = 4)", "train.micro_batch=2"]
    with pytest.raises(Diagnostics) as info:  # parc check refuses it as parc build does
        load("examples/gpt3-175b.par", unbuilt)
    assert [e.code for e in info.value.errors] == ["PAR0270"]
    spec = load("examples/gpt3-175b.par", unbuilt, buildable=False)  # as parc plan reads it
    result = search(spec, hardware_for(spec))
    assert result.estimates and all(e.layout.zero == 3 for e in result.estimates)
    assert result.winner is None
    with pytest.raises(Diagnostics) as info:  # the build refuses it before planning, as parc check does
        lower(spec)
    assert [e.code for e in info.value.errors] == ["PAR0270"]


def test_memory_prunes_and_accounting_differs():
    spec = load("examples/gpt3-175b.par", ["parallel.tp=8", "parallel.pp=1", "parallel.zero=0"])
    hw = hardware_for(spec)
    only = candidates(spec)
    assert only and not any(estimate(spec, layout, hw).fits for layout in only)  # 175B over tp 8 alone
    layout = only[0]
    parc = estimate(spec, layout, hw, Accounting.PARC).memory
    megatron = estimate(spec, layout, hw, Accounting.MEGATRON).memory
    # bf16 parameters with fp32 masters in both (runtime/optimizers/master.py): 2 + 2 + 12 bytes an element,
    # plus torch's 4-byte AdamW step per tensor in parc's; activations counted differently. With
    # several micro-batches parc hands the step's fp32 gradient sums to the reducers (Note [fp32
    # accumulation]): 4-byte gradients, as Megatron-LM's own main_grad, not the paper's 2
    assert layout.grad_accum(spec.train.global_batch) > 1
    assert (parc.params, parc.grads) == (megatron.params, 2 * megatron.grads)
    assert parc.optimizer > megatron.optimizer and parc.activations != megatron.activations


def test_no_layout_rule_reads_two_leaf_settings():
    """layouts._leaves filters ZeRO, sp and each per-layer setting one at a time: sound
    only while no layout rule reads two of them together."""
    from parc.runtime.layout.layouts import LEAF_NAMES
    from parc.runtime.layout.constraints import LAYOUT, RULES

    for rule in RULES:
        if rule.kind == LAYOUT:
            assert len(set(LEAF_NAMES) & {*rule.needs, *rule.optional}) <= 1, rule.name


def test_every_rule_reads_declared_values_and_a_declaration_keeps_its_key():
    """Note [a feature declares its values]: with constraints/ imported every name a rule
    reads is in KEYS or derived (checked once constraints/ has imported them all; Note [a derived
    value]), and no feature re-points a name."""
    from parc.runtime.layout.constraints import BUILD, DERIVED, KEYS, LAYOUT, RULES, rules_of
    from parc.runtime.layout.rule_keys import declare

    assert rules_of((LAYOUT, BUILD)) == tuple(RULES)
    assert all(name in KEYS or name in DERIVED for rule in RULES for name in (*rule.needs, *rule.optional))
    declare(tp="parallel.tp")  # the same key again changes nothing
    with pytest.raises(ValueError, match="already name other spec keys"):
        declare(tp="parallel.cp")
    assert KEYS["tp"] == "parallel.tp"


def test_a_derived_value_is_computed_where_read_and_counts_its_inputs():
    """Note [a derived value]: a rule reading ``tp_2d`` (rules_mesh.py's, from tp_shape) runs on
    its value and is re-checked when tp_shape is bound; the planner's verdict cache keys a
    BUILD rule reading ZeRO's ``per_layer_zero`` on the ``Layout`` fields behind it."""
    from parc.codegen.planner.cost.estimate import _build_rules
    from parc.runtime.layout.constraints import DERIVED, LAYOUT, RULES, _run, _selected, reads

    sp = next(r for r in RULES if r.name == "sequence_parallel")
    assert {"tp_2d", "tp_shape"} <= reads(sp) and sp in _selected((LAYOUT,), ("tp_shape",))
    values = {"sp": True, "tp": 4, "seq_len": 66}
    assert _run(sp, {**values, "tp_shape": (2, 2)}) is None  # a 2D grid splits over C = 2: sequence_parallel_2d's
    assert _run(sp, {**values, "tp_shape": (1, 4)}).code == "PAR0210"
    assert _run(DERIVED["padded_vocab"], {"vocab": 50257, "pad_vocab_to": 128}) == 50304
    assert _run(DERIVED["padded_vocab"], {"vocab": 50257}) is None  # an unknown input: unknown
    names = dict((entry.name, names) for entry, names in _build_rules())["hetero_unbuilt"]
    assert "zero" in names and "compress" in names


def test_candidates_with_stage_layers_match_its_length():
    """stage_layers = [1, 3] fixes pp = 2 (the search once proposed other pp, which the build refused)."""
    spec = load("examples/tiny.par", ["parallel=auto", "parallel.stage_layers=[1, 3]", "mesh.devices_per_node=8"])
    layouts = candidates(spec)
    assert layouts and {layout.pp for layout in layouts} == {2}


def test_uneven_terapipe_slices_are_costed_by_their_lengths():
    """The exact re-scoring runs each slice as long as its tokens (docs/planner.md): a
    first slice of half the sequence stalls the warm-up; nearly equal slices cost less."""
    exact = makespan("terapipe", stages=2, micro_batches=4, chunks=1, slices=3, forward=1.0, backward=2.0,
                     comm=0.0, exact=True, slice_scale=(1.5, 0.75, 0.75))
    assert exact > makespan("terapipe", stages=2, micro_batches=4, chunks=1, slices=3, forward=1.0,
                            backward=2.0, comm=0.0, exact=True)
    tokens_per_s = {}
    for slices in ("[32, 16, 16]", "[22, 21, 21]"):
        spec = load("examples/tiny.par", ["parallel.dp=2", "parallel.tp=1", "parallel.pp=2",
                                          f"parallel.schedule=terapipe(slices = {slices})"])
        (item,) = search(spec, hardware_for(spec)).estimates
        assert item.layout.slices == 3
        tokens_per_s[slices] = item.tokens_per_s
    assert tokens_per_s["[32, 16, 16]"] < tokens_per_s["[22, 21, 21]"]
