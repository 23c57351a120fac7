"""Shared set-up of the kernel tests: one compile of the CPU kernels per session.

The session starts two processes that load the kernels at the same time into an
empty cache folder (the race of ranks on first use, Note [kernel cache]); the tests
then use that folder, so the whole directory compiles once. ``first_use`` records
what each racer saw for test_cache.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

RACER = """
import json, time
from parc.runtime.kernels.build import load_cpu
module = load_cpu()
print(json.dumps({"file": None if module is None else module.__file__}))
"""


@dataclass(frozen=True)
class FirstUse:
    cache: str
    results: tuple  # (returncode, stdout json or None, stderr) per racer


def run_python(code, env_extra, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def first_use(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARC_KERNEL_CACHE": str(cache)}
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=900)
        parsed = json.loads(out.strip().splitlines()[-1]) if racer.returncode == 0 and out.strip() else None
        results.append((racer.returncode, parsed, err))
    return FirstUse(cache=str(cache), results=tuple(results))


@pytest.fixture(scope="session")
def ops(first_use):
    """The compiled ops, loaded from the session's cache folder."""
    previous = os.environ.get("PARC_KERNEL_CACHE")
    os.environ["PARC_KERNEL_CACHE"] = first_use.cache
    from parc.runtime.kernels import select

    loaded = select("compiled", "cpu")
    if loaded is None:
        pytest.fail("the CPU kernels did not build; see the notice above")
    yield loaded
    if previous is None:
        os.environ.pop("PARC_KERNEL_CACHE", None)
    else:
        os.environ["PARC_KERNEL_CACHE"] = previous
