"""Generated trainers' runs shared by the tests that read them: one torchrun launch per world size and unit.

A test module says which runs a test of it reads with ``cases_of(item) -> list[Case]``
(tests/parity/batch.py); ``trainers`` holds the runs of every selected test of the
same *unit* (``unit_of``), so ``-k`` launches only what the selected tests read, and
the runs of a unit that need the same world size share a launch.

``make test`` runs the suite in two pytest processes (pytest-xdist, ``-n 2``):
the trainers' launches use about half of two cores on their own (ranks wait on each
other, processes start), so another process's tests fill the rest. A unit runs whole
in one process, so a module's fixtures are made once. The modules that read
``trainers`` (SHARED) form four units, so the two processes share the trainers' runs
too: the dense parity layouts of gpt, those of llama, every other module that
reads them (MoE layouts, memory, precision, compression, eval, the planner's
measurements), and the checkpoints' runs (initial states, resume, reshard, precision, faults, from an import). A case two units read (a one-rank reference) runs once per process
that needs it. Every other test file is a unit of its own (the bad files' refusals and
test_call_signatures' trained pairs read ``trainers`` in units of their own).

Note [one compile per run]: the compiled CPU kernels are built once for the whole
run, into the one cache every process of the run reads (Note [kernel cache]:
``$PARC_KERNEL_CACHE``, else the user's cache folder). Each pytest process loads
them right after collection when a selected test may run them (``KERNEL_FREE``);
with an empty cache the first process compiles and the others, and every trainer
they launch later, wait on the cache's lock and load that build, however long it
takes. Without this the first users would be the trainers of a parity launch,
whose ranks would then sit through the compile inside ``batch.py``'s stall timeout.
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
    "tests/checkpoint/test_bad_files.py", "tests/checkpoint/test_faults.py", "tests/checkpoint/test_hf_import.py", "tests/checkpoint/test_init_shards.py",
    "tests/checkpoint/test_precision.py", "tests/checkpoint/test_resume.py", "tests/parity/test_compress.py", "tests/parity/test_memory.py",
    "tests/parity/test_parity.py", "tests/parity/test_parity_precision.py", "tests/parity/test_planned.py",
    "tests/planner/test_context_memory.py", "tests/planner/test_measured.py",
    "tests/codegen/test_call_signatures.py",
)
"""The modules that read ``trainers`` (those defining ``cases_of``)."""
PARITY_LAYOUTS = "tests/parity/test_parity.py::test_layout_matches_single_rank["
OWN_UNITS = {"tests/checkpoint/test_resume.py": "trainers-checkpoints",
             "tests/checkpoint/test_faults.py": "trainers-checkpoints",
             "tests/checkpoint/test_hf_import.py": "trainers-checkpoints",
             "tests/checkpoint/test_init_shards.py": "trainers-checkpoints",
             "tests/checkpoint/test_precision.py": "trainers-checkpoints",
             "tests/checkpoint/test_bad_files.py": "trainers-bad-files",
             "tests/codegen/test_call_signatures.py": "tests/codegen/test_call_signatures.py"}
"""SHARED modules whose runs share nothing with the others': a unit of their own (the
module's own file for one that would be a unit of its own but for its launch)."""
SHARED_UNITS = ("trainers-gpt", "trainers-llama", "trainers", "trainers-checkpoints", "trainers-bad-files")
"""The SHARED units, longest first (xdist hands them out in this order)."""
KERNEL_FREE = ("tests/dsl/", "tests/test_")
"""Test files that run no model, so never the compiled kernels (Note [one compile per run])."""


def unit_of(nodeid: str) -> str:
    """The pytest-xdist unit of a test: its file, or one of SHARED_UNITS."""
    path = nodeid.split("::")[0]
    if path not in SHARED:
        return path
    if path in OWN_UNITS:
        return OWN_UNITS[path]
    if nodeid.startswith(PARITY_LAYOUTS):  # ...[tp2-sp-gpt]: split by the model
        return f"trainers-{nodeid.rstrip(']').rsplit('-', 1)[1]}"
    return "trainers"


def pytest_collection_modifyitems(config, items):
    """The SHARED units' tests first, longest unit first; SHARED checked."""
    reading = {item.nodeid.split("::")[0] for item in items if hasattr(getattr(item, "module", None), "cases_of")}
    if not reading <= set(SHARED):
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(reading - set(SHARED))} to SHARED")
    order = {unit: rank for rank, unit in enumerate(SHARED_UNITS)}
    items.sort(key=lambda item: order.get(unit_of(item.nodeid), len(order)))  # stable
    if any(not item.nodeid.startswith(KERNEL_FREE) for item in items) and not config.option.collectonly:
        load_kernels_once(config)


def load_kernels_once(config) -> None:
    """Load the compiled CPU kernels into this process, compiling them if no process
    has yet (Note [one compile per run]); a failure is one line, and the kernel
    tests fail on it (tests/kernels/conftest.py's ``ops``)."""
    from parc.runtime.kernels import build

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"parc: loading the compiled CPU kernels from {build.cache_root()} "
                            "(an empty cache compiles them once for the whole run: minutes)")
    build.load_cpu()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units for pytest-xdist: ``unit_of`` each test."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByFile(config, log)


@pytest.fixture(scope="session")
def _units(tmp_path_factory):
    """This process's ``Batches`` by unit, sharing one table of results."""
    return {}, {}


@pytest.fixture
def trainers(request, tmp_path_factory, _units):
    """``trainers.run(case)`` / ``trainers.records(case)`` for the test's unit, made on
    first use (Note [one launch, many trainers])."""
    batches, results = _units
    unit = unit_of(request.node.nodeid)
    if unit not in batches:
        wanted = []
        for item in request.session.items:
            cases_of = getattr(getattr(item, "module", None), "cases_of", None)
            if cases_of is not None and unit_of(item.nodeid) == unit:
                wanted += cases_of(item)
        batches[unit] = Batches(tmp_path_factory, wanted, results)
    return batches[unit]
