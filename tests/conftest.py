"""Generated trainers' runs shared by the whole session: one torchrun launch per world size.

A test module says which runs a test of it reads with ``cases_of(item) -> list[Case]``
(tests/parity/batch.py); the session's ``trainers`` holds every selected test's runs,
so ``-k`` launches only what the selected tests read, and the runs of
tests/parity/ (layouts, memory, the planned build) and tests/planner/test_measured.py
that need the same world size share a launch.

``make test`` runs the suite in two pytest processes (pytest-xdist, ``-n 2``):
the trainers' launches use about half of two cores on their own (ranks wait on each
other, processes start), so another process's tests fill the rest. Each test file is
one group, so a module's fixtures are made once; every module that reads ``trainers``
is in one group, so its launches are shared as above and made once.
"""

from __future__ import annotations

import os

if os.environ.get("PARC_TRITON_TESTS_ON_GPU") != "1":
    # Triton runs on CPU only in its interpreter, which must be chosen before anything
    # imports triton (tests/kernels/test_triton.py): a module collected earlier that
    # pulls triton in (through torch) would otherwise leave its kernels compiled for a GPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Note [eager at small shapes] (runtime/kernels/dispatch.py): the tests' models are tiny,
# and would run eager PyTorch where the kernels do not pay; the tests check the kernels
os.environ.setdefault("PARC_KERNELS_EAGER_BELOW", "0")

import pytest

from parity.batch import Batches  # tests/ is on sys.path for this file (no __init__.py)


SHARED = (
    "tests/observe/test_eval_parity.py", "tests/parity/test_compress.py", "tests/parity/test_memory.py",
    "tests/parity/test_parity.py", "tests/parity/test_parity_precision.py", "tests/parity/test_planned.py",
    "tests/planner/test_context_memory.py", "tests/planner/test_measured.py",
)
"""The modules that read ``trainers`` (those defining ``cases_of``): one pytest-xdist unit."""


def pytest_collection_modifyitems(config, items):
    """The shared modules' tests first (the longest unit starts first); SHARED checked."""
    reading = {item.nodeid.split("::")[0] for item in items if hasattr(getattr(item, "module", None), "cases_of")}
    if not reading <= set(SHARED):
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(reading - set(SHARED))} to SHARED")
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in SHARED)  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units for pytest-xdist: each test file, and the SHARED modules as one."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "trainers" if path in SHARED else path

    return ByFile(config, log)


@pytest.fixture(scope="session")
def trainers(request, tmp_path_factory):
    """``trainers.run(case)`` / ``trainers.records(case)``, made on first use (Note [one launch, many trainers])."""
    wanted = []
    for item in request.session.items:
        cases_of = getattr(getattr(item, "module", None), "cases_of", None)
        if cases_of is not None:
            wanted += cases_of(item)
    return Batches(tmp_path_factory, wanted)
