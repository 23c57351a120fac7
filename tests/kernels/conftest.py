"""Shared set-up of the kernel tests: the run's one compile of the CPU kernels, and a race.

``ops`` is the compiled CPU ops from the run's kernel cache, which tests/conftest.py
filled once for the whole run (Note [one compile per run]); a compile that failed
fails each kernel test with the one line that says why, not a traceback.
``first_use`` is the race of ranks on first use (Note [kernel cache]) on a tiny
extension of its own, so that it costs seconds, not a second compile of the kernels:
two processes load it at the same moment from an empty cache folder, and it records
what each of them saw for test_cache.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from parc.runtime.kernels import build

RACE_SOURCE = r"""
// The smallest module cpp_extension can build: no torch headers, so it compiles in a moment.
#include <Python.h>
#define PARC_JOIN(a, b) a##b
#define PARC_INIT(name) PARC_JOIN(PyInit_, name)
#define PARC_TEXT(name) PARC_QUOTE(name)
#define PARC_QUOTE(name) #name
static struct PyModuleDef race_module = {PyModuleDef_HEAD_INIT, PARC_TEXT(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC PARC_INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&race_module); }
"""

RACER = """
import json, os, sys, time
from pathlib import Path
from parc.runtime.kernels.build import Extension, load
extension = Extension(name="parc_race", folder=Path(sys.argv[1]), sources=("race.cpp",), what="the race module")
Path(sys.argv[2]).touch()  # ready; start together with the other racer
while len(list(Path(sys.argv[2]).parent.glob("ready-*"))) < 2:
    time.sleep(0.01)
module = load(extension)
print(json.dumps({"file": None if module is None else module.__file__}))
"""


def race_extension(folder: Path) -> build.Extension:
    """The racers' extension (RACER builds the same one)."""
    return build.Extension(name="parc_race", folder=folder, sources=("race.cpp",), what="the race module")


@dataclass(frozen=True)
class FirstUse:
    cache: str
    extension: build.Extension
    results: tuple  # (returncode, stdout json or None, stderr) per racer


def run_python(code, env_extra, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def first_use(tmp_path_factory):
    source = tmp_path_factory.mktemp("race-source")
    (source / "race.cpp").write_text(RACE_SOURCE)
    cache, barrier = tmp_path_factory.mktemp("race-cache"), tmp_path_factory.mktemp("race-barrier")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARC_KERNEL_CACHE": str(cache)}
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(source), str(barrier / f"ready-{index}")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for index in range(2)
    ]
    results = []
    for racer in racers:
        out, err = racer.communicate()  # no timeout: the loser waits on the lock as long as the compile takes
        parsed = json.loads(out.strip().splitlines()[-1]) if racer.returncode == 0 and out.strip() else None
        results.append((racer.returncode, parsed, err))
    return FirstUse(cache=str(cache), extension=race_extension(source), results=tuple(results))


@pytest.fixture(scope="session")
def ops():
    """The compiled ops, loaded from the run's kernel cache (Note [one compile per run])."""
    from parc.runtime.kernels import select

    loaded = select("compiled", "cpu")
    if loaded is None:
        pytest.fail(f"the CPU kernels did not build: {build.failure()}", pytrace=False)
    return loaded
