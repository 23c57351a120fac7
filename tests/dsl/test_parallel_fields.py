"""The parallel block's keys as ParallelSpec fields (dsl/parallel_fields.py, Note [a key is its field])."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parc.dsl import load, parallel_fields
from parc.dsl.spec import ParallelSpec

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.par"
FIELDS = {f.name for f in dataclasses.fields(ParallelSpec)}


def test_every_key_argument_and_auto_names_a_field() -> None:
    for param in parallel_fields.KEYS:
        assert param.name in FIELDS, param.name
        assert param.auto_field is None or param.auto_field in FIELDS, param.name
    assert set(parallel_fields.ARGUMENTS) <= FIELDS, set(parallel_fields.ARGUMENTS) - FIELDS


@pytest.mark.parametrize("sets", [
    (),
    ("parallel=auto",),
    ("parallel.tp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = [32, 16, 16])"),
    ("parallel.zero=3", "parallel.zero_shard=node", "parallel.zero_prefetch=2"),
    ("parallel.compress=topk(ratio = 0.1)", "parallel.error_feedback=false", "parallel.tp_shape=auto"),
    ("parallel.tp=1", "parallel.pp=2", "parallel.compress_pp=lowrank(rank = 2, lazy_error = true)",
     "parallel.compress_stages=[1]"),
])
def test_the_document_of_the_fields_reads_back_as_them(sets) -> None:
    par = load(str(TINY), list(sets), buildable=False).parallel
    fields = parallel_fields.read(parallel_fields.document(par), whole_auto=False)
    assert fields == {name: getattr(par, name) for name in fields}


def test_an_unwritten_call_reads_as_its_kind_and_its_arguments_defaults() -> None:
    fields = parallel_fields.read({}, whole_auto=False)
    defaults = ParallelSpec(dp=None, tp=None, pp=None)
    assert fields == {name: getattr(defaults, name) for name in fields}
