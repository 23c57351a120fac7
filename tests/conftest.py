"""Generated trainers' runs shared by the whole session: one torchrun launch per world size.

A test module says which runs a test of it reads with ``cases_of(item) -> list[Case]``
(tests/parity/batch.py); the session's ``trainers`` holds every selected test's runs,
so ``-k`` launches only what the selected tests read, and the runs of
tests/parity/ (layouts, memory, the planned build) and tests/planner/test_measured.py
that need the same world size share a launch.

``make test`` runs the suite in two pytest processes (pytest-xdist, ``--dist loadgroup``):
the trainers' launches use about half of two cores on their own (ranks wait on each
other, processes start), so another process's tests fill the rest. Each test file is
one group, so a module's fixtures are made once; every module that reads ``trainers``
is in one group, so its launches are shared as above and made once.
"""

from __future__ import annotations

import pytest

from parity.batch import Batches  # tests/ is on sys.path for this file (no __init__.py)


def pytest_collection_modifyitems(config, items):
    """Each item's pytest-xdist group: ``trainers`` for modules that read the shared runs, else its file."""
    for item in items:
        shared = getattr(getattr(item, "module", None), "cases_of", None) is not None
        item.add_marker(pytest.mark.xdist_group("trainers" if shared else item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def trainers(request, tmp_path_factory):
    """``trainers.run(case)`` / ``trainers.records(case)``, made on first use (Note [one launch, many trainers])."""
    wanted = []
    for item in request.session.items:
        cases_of = getattr(getattr(item, "module", None), "cases_of", None)
        if cases_of is not None:
            wanted += cases_of(item)
    return Batches(tmp_path_factory, wanted)
