"""Generated trainers' runs shared by the whole session: one torchrun launch per world size.

A test module says which runs a test of it reads with ``cases_of(item) -> list[Case]``
(tests/parity/batch.py); the session's ``trainers`` holds every selected test's runs,
so ``-k`` launches only what the selected tests read, and the runs of
tests/parity/ (layouts, memory, the planned build) and tests/planner/test_measured.py
that need the same world size share a launch.
"""

from __future__ import annotations

import pytest

from parity.batch import Batches  # tests/ is on sys.path for this file (no __init__.py)


@pytest.fixture(scope="session")
def trainers(request, tmp_path_factory):
    """``trainers.run(case)`` / ``trainers.records(case)``, made on first use (Note [one launch, many trainers])."""
    wanted = []
    for item in request.session.items:
        cases_of = getattr(getattr(item, "module", None), "cases_of", None)
        if cases_of is not None:
            wanted += cases_of(item)
    return Batches(tmp_path_factory, wanted)
