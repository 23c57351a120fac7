"""Compile the C++ CPU kernels on first use and cache them on disk.

Takes: the sources under ``cpu/`` (they travel with the runtime, so a build folder
can compile them), the compiler (``CXX``, default ``c++``) and
``torch.utils.cpp_extension``. Gives: ``load_cpu()``, the compiled module, or None
after printing one line to stderr when compiling is impossible; ``ops.py`` falls
back to the eager reference then.

Note [kernel cache]: the module lives in ``<cache>/parc_cpu_<key>/parc_cpu_<key>.so``
where the key hashes the sources, torch's version, Python's ABI, the compiler and
its version, the flags and (for ``-march=native``) this CPU's feature flags. The
cache folder is ``$PARC_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/parc/kernels``, else
``~/.cache/parc/kernels``. Ranks that start together race on first use: each takes
an exclusive ``fcntl`` lock on ``<cache>/parc_cpu_<key>.lock``; the first compiles
into a private folder and renames the finished ``.so`` into place (a rename is
atomic), the others wait on the lock and then load that file. A cached ``.so`` is
loaded without touching the compiler at all.
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
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCES = ("cpu/norms.cpp", "cpu/add_norm.cpp", "cpu/pointwise.cpp", "cpu/cross_entropy.cpp", "cpu/block_attention.cpp", "cpu/moe.cpp", "cpu/bindings.cpp")
HEADERS = ("cpu/common.h", "cpu/math.h", "cpu/norm_rows.h")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
LDFLAGS = ("-fopenmp",)  # torch's own libgomp.so.1 is already loaded and is reused

_lock = threading.Lock()
_modules: dict[str, object] = {}
_noticed = False


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


def cache_key() -> str:
    """Hash of everything the compiled module depends on (Note [kernel cache])."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    try:
        version = subprocess.run(
            [_compiler(), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = ["unknown"]
    parts = (
        torch.__version__, str(torch.version.git_version), sys.version,
        str(sysconfig.get_config_var("EXT_SUFFIX")), _compiler(), *version,
        *CFLAGS, "|", *LDFLAGS, platform.machine(), _cpu_features(),
    )
    digest.update("\0".join(parts).encode())
    return digest.hexdigest()[:16]


def notice(reason: str) -> None:
    """Say once per process that the compiled kernels are not used, and why."""
    global _noticed
    if not _noticed:
        _noticed = True
        print(f"parc: compiled kernels unavailable ({reason}); using the eager reference", file=sys.stderr)


def _import(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(name: str, root: Path, target: Path):
    from torch.utils import cpp_extension

    scratch = root / f"{name}.build-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(HERE / s) for s in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            extra_include_paths=[str(HERE / "cpu")],
            build_directory=str(scratch),
            verbose=False,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / f"{name}.so", target)  # atomic: a reader sees all or nothing
        return module
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _load(root: Path):
    key = cache_key()
    name = f"parc_cpu_{key}"
    target = root / name / f"{name}.so"
    if target.exists():  # the common case: no lock, no compiler
        return _import(name, target)
    cxx = _compiler()
    if shutil.which(cxx) is None:
        notice(f"no C++ compiler: CXX={cxx!r} not found")
        return None
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.exists():  # another rank compiled it while we waited
                return _import(name, target)
            try:
                return _compile(name, root, target)
            except Exception as error:  # compiler errors, missing ninja, ...
                log = root / f"{name}.error.log"
                log.write_text(f"{type(error).__name__}: {error}\n")
                notice(f"building the CPU kernels failed, see {log}")
                return None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_cpu():
    """The compiled CPU kernels' module, or None (after one notice) if unavailable."""
    root = cache_root()
    with _lock:
        if str(root) not in _modules:
            try:
                _modules[str(root)] = _load(root)
            except OSError as error:  # an unwritable cache folder, ...
                notice(f"kernel cache {root}: {error.strerror or error}")
                _modules[str(root)] = None
        return _modules[str(root)]
