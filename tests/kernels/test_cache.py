"""The compile-on-first-use cache (Note [kernel cache]) and the fallback notice."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

from conftest import run_python

from parc.runtime.kernels import build

LOAD = """
import sys
from parc.runtime.kernels import select
from parc.runtime.kernels.build import load_cpu
first, second = select("compiled", "cpu"), select("compiled", "cpu")
module = load_cpu()
print(first is None, second is None, None if module is None else module.__file__)
"""


def test_two_ranks_racing_on_first_use_both_load_one_build(first_use):
    for returncode, result, stderr in first_use.results:
        assert returncode == 0, stderr
        assert result["file"] is not None, stderr
    built = [r["file"] for _, r, _ in first_use.results if ".build-" in r["file"]]
    assert len(built) == 1  # one compiled, the other waited on the lock and loaded it
    cache = Path(first_use.cache)
    name = f"parc_race_{build.cache_key(first_use.extension)}"
    assert [p.name for p in cache.glob("*/*.so")] == [f"{name}.so"]
    assert [r["file"] for _, r, _ in first_use.results if ".build-" not in r["file"]] == [str(cache / name / f"{name}.so")]
    assert not list(cache.glob("*.build-*"))  # scratch folders are removed


def test_second_load_reads_the_cache_without_compiling(ops):
    so = build.cache_root() / f"parc_cpu_{build.cache_key()}" / f"parc_cpu_{build.cache_key()}.so"
    stamp = so.stat().st_mtime_ns
    done = run_python(LOAD, {"PARC_KERNEL_CACHE": str(build.cache_root())})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", str(so)]
    assert done.stderr == ""
    assert so.stat().st_mtime_ns == stamp


def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PARC_KERNEL_CACHE", str(tmp_path / "mine"))
    assert build.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("PARC_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "parc" / "kernels"


def test_key_follows_sources_headers_flags_and_compiler(monkeypatch, tmp_path):
    key = build.cache_key()
    assert build.cache_key(replace(build.CPU, cflags=build.CPU.cflags + ("-DPARC_TEST",))) != key
    assert build.cache_key(replace(build.CPU, ldflags=())) != key
    assert build.cache_key(replace(build.CPU, sources=build.CPU.sources[:-1])) != key
    copy = tmp_path / "kernels"
    shutil.copytree(build.CPU.folder / "cpu", copy / "cpu")
    assert build.cache_key(replace(build.CPU, folder=copy)) == key
    header = copy / build.CPU.headers[-1]
    header.write_text(header.read_text() + "\n// a header edit is a new binary\n")
    assert build.cache_key(replace(build.CPU, folder=copy)) != key
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert build.cache_key() != key


def test_key_covers_every_source_file_of_the_kernels():
    """A .cpp or .h of cpu/ that CPU does not list would change the binary but not the key."""
    files = {f"cpu/{p.name}" for p in (build.CPU.folder / "cpu").iterdir() if p.suffix in (".cpp", ".h")}
    assert files == set(build.CPU.sources) | set(build.CPU.headers)


def test_missing_compiler_says_so_once_and_falls_back(tmp_path):
    done = run_python(LOAD, {"PARC_KERNEL_CACHE": str(tmp_path), "CXX": "/nonexistent/c++"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "None"]
    assert done.stderr == (
        "parc: compiled kernels unavailable (no C++ compiler: CXX='/nonexistent/c++' not found); "
        "using the eager reference\n"
    )


def test_build_error_says_so_once_and_keeps_the_log(tmp_path):
    done = run_python(LOAD, {"PARC_KERNEL_CACHE": str(tmp_path), "CXX": "false"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "None"]
    line = re.fullmatch(
        r"parc: compiled kernels unavailable \(building the CPU kernels failed, see (\S+)\); "
        r"using the eager reference\n",
        done.stderr,
    )
    assert line, done.stderr
    assert os.path.getsize(line.group(1)) > 0
    assert not list(tmp_path.glob("*/*.so"))
