"""Compile the C++ CPU kernels on first use and cache them on disk.

Takes: the sources under ``cpu/`` (they travel with the runtime, so a build folder
can compile them), the compiler (``CXX``, default ``c++``) and
``torch.utils.cpp_extension``. Gives: ``load_cpu()``, the compiled module, or None
after printing one line to stderr when compiling is impossible; ``ops.py`` falls
back to the eager reference then. ``load(extension)`` does the same for any
``Extension`` (tests/kernels/test_cache.py races two processes on a tiny one).

Note [kernel cache]: the module lives in ``<cache>/<name>_<key>/<name>_<key>.so``
where the key hashes the sources and the headers they include (every ``.cpp`` and
``.h`` of ``cpu/`` is one or the other: tests/kernels/test_cache.py), torch's
version, Python's ABI, the compiler and its version, the flags and (for
``-march=native``) this CPU's feature flags. The cache folder is ``$PARC_KERNEL_CACHE``, else
``$XDG_CACHE_HOME/parc/kernels``, else ``~/.cache/parc/kernels``. Ranks that start
together race on first use: each takes an exclusive ``fcntl`` lock on
``<cache>/<name>_<key>.lock``; the first compiles into a private folder and renames
the finished ``.so`` into place (a rename is atomic), the others wait on the lock,
however long the compile takes, and then load that file. A cached ``.so`` is loaded
without touching the compiler at all. A failed compile leaves its whole output in
``<cache>/<name>_<key>.error.log``; ``failure()`` says why in one line.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Extension:
    """A C++ extension compiled on first use: its name, sources, headers and flags.
    Paths are relative to ``folder``; ``include`` is the folder the sources include from."""

    name: str
    folder: Path
    sources: tuple[str, ...]
    headers: tuple[str, ...] = ()
    include: str = "."
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    what: str = "the extension"
    """Its words in a notice: "building {what} failed"."""


CPU = Extension(
    name="parc_cpu",
    folder=HERE,
    sources=("cpu/norms.cpp", "cpu/add_norm.cpp", "cpu/pointwise.cpp", "cpu/cross_entropy.cpp",
             "cpu/block_attention.cpp", "cpu/moe.cpp", "cpu/bindings.cpp"),
    headers=("cpu/common.h", "cpu/math.h", "cpu/norm_rows.h"),
    include="cpu",
    cflags=("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"),
    ldflags=("-fopenmp",),  # torch's own libgomp.so.1 is already loaded and is reused
    what="the CPU kernels",
)

_lock = threading.Lock()
_modules: dict[tuple[str, str], object] = {}
_noticed = ""


def cache_root() -> Path:
    """The cache folder (Note [kernel cache])."""
    if os.environ.get("PARC_KERNEL_CACHE"):
        return Path(os.environ["PARC_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "parc" / "kernels"


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cache_key(extension: Extension = CPU) -> str:
    """Hash of everything the compiled module depends on (Note [kernel cache])."""
    digest = hashlib.sha256()
    for name in extension.sources + extension.headers:
        digest.update(name.encode() + b"\0" + (extension.folder / name).read_bytes() + b"\0")
    try:
        version = subprocess.run(
            [_compiler(), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = ["unknown"]
    parts = (
        torch.__version__, str(torch.version.git_version), sys.version,
        str(sysconfig.get_config_var("EXT_SUFFIX")), _compiler(), *version,
        *extension.cflags, "|", *extension.ldflags, platform.machine(), _cpu_features(),
    )
    digest.update("\0".join(parts).encode())
    return digest.hexdigest()[:16]


def notice(reason: str) -> None:
    """Say once per process that the compiled kernels are not used, and why."""
    global _noticed
    if not _noticed:
        _noticed = reason
        print(f"parc: compiled kernels unavailable ({reason}); using the eager reference", file=sys.stderr)


def failure() -> str:
    """Why this process runs without compiled kernels ("" when nothing failed)."""
    return _noticed


def _import(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(extension: Extension, name: str, root: Path, target: Path):
    from torch.utils import cpp_extension

    scratch = root / f"{name}.build-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(extension.folder / s) for s in extension.sources],
            extra_cflags=list(extension.cflags),
            extra_ldflags=list(extension.ldflags),
            extra_include_paths=[str(extension.folder / extension.include)],
            build_directory=str(scratch),
            verbose=False,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / f"{name}.so", target)  # atomic: a reader sees all or nothing
        return module
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _load(extension: Extension, root: Path):
    name = f"{extension.name}_{cache_key(extension)}"
    target = root / name / f"{name}.so"
    if target.exists():  # the common case: no lock, no compiler
        return _import(name, target)
    cxx = _compiler()
    if shutil.which(cxx) is None:
        notice(f"no C++ compiler: CXX={cxx!r} not found")
        return None
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # no timeout: a slow compile is waited for
        try:
            if target.exists():  # another rank compiled it while we waited
                return _import(name, target)
            try:
                return _compile(extension, name, root, target)
            except Exception as error:  # compiler errors, missing ninja, ...
                log = root / f"{name}.error.log"
                log.write_text(f"{type(error).__name__}: {error}\n")
                notice(f"building {extension.what} failed, see {log}")
                return None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load(extension: Extension):
    """The compiled module of ``extension``, or None (after one notice) if unavailable."""
    root = cache_root()
    with _lock:
        if (str(root), extension.name) not in _modules:
            try:
                _modules[str(root), extension.name] = _load(extension, root)
            except OSError as error:  # an unwritable cache folder, ...
                notice(f"kernel cache {root}: {error.strerror or error}")
                _modules[str(root), extension.name] = None
        return _modules[str(root), extension.name]


def load_cpu():
    """The compiled CPU kernels' module, or None (after one notice) if unavailable."""
    return load(CPU)
