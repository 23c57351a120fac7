"""The layout's options are declared once (dsl/keys/layout_options.py, Note [one record of the options])."""

from __future__ import annotations

import dataclasses

from parc.codegen import plan
from parc.codegen.planner.cost.layout import Layout
from parc.dsl.keys import PARALLEL
from parc.dsl.keys.layout_options import LayoutOptions, SpecOptions, in_plan
from parc.dsl.spec import ParallelSpec, TrainSpec


def _defaults(record: type) -> dict:
    return {f.name: f.default for f in dataclasses.fields(record)}


def test_the_spec_and_the_planner_inherit_the_options_with_their_defaults():
    assert issubclass(ParallelSpec, SpecOptions) and issubclass(Layout, LayoutOptions)
    assert _defaults(LayoutOptions).items() <= _defaults(Layout).items()
    assert _defaults(SpecOptions).items() <= _defaults(ParallelSpec).items()


def test_each_cited_option_is_a_field_of_its_plan_part():
    parts = {"mesh": plan.MeshPlan, "model": plan.ModelPlan, "train": plan.TrainPlan}
    placed = {part: in_plan(part) for part in parts}
    assert all(placed.values())  # every part holds at least one option today
    for part, entries in placed.items():
        fields = {f.name: f for f in dataclasses.fields(parts[part])}
        for name, option, when, note in entries:
            assert fields[name].metadata["cited"] == (f"parallel.{option}", when, note)
            assert (fields[name].default is dataclasses.MISSING) == (when is None)


def test_a_plan_part_is_filled_from_the_spec_by_the_record():
    class Spec:  # the two blocks ``from_spec`` reads for TrainPlan
        parallel = ParallelSpec(dp=1, tp=1, pp=1, zero=3, zero_shard="node")
        train = TrainSpec(global_batch=8, micro_batch=1, steps=1)

        def span(self, key):
            return None

    filled = plan.from_spec(plan.TrainPlan, Spec())
    assert filled["zero_shard"] == plan.Setting(name="ZERO_SHARD", value="node", span=None)
    assert Spec.parallel.by_node


def test_each_option_key_is_in_the_table_after_its_anchor():
    names = [key.name for key in PARALLEL.keys]
    options = [f for f in dataclasses.fields(SpecOptions) if "key" in f.metadata]
    assert options
    for f in options:
        key, after = f.metadata["key"]
        assert key.name == f.name and PARALLEL.key(f.name) is key  # Note [a key is its field]
        assert names.index(f.name) == names.index(after) + 1
