"""Build folders: what parc generates for a spec, and writing it into a folder.

Takes: a ``Plan`` (or a spec path). Gives: the files of a build — the rendered ones,
the byte-identical ``parc_runtime/`` copy of ``runtime/`` and ``.parc/manifest.json``
(format, parc version, spec hash, each file's sha256 as generated); ``build_to`` for
tests and benchmarks. The folder's safe readers and writers are
``codegen/build_folder.py`` (Note [a build folder is untrusted input]); what a
rebuild does to the user's edits is ``codegen/build_merge.py``. Before:
``codegen/render.py``. After: the user's ``torchrun``.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from parc import __version__

from .build_folder import (  # noqa: F401 - re-exported: callers know them as build.*
    BASES,
    FORMAT,
    MANIFEST,
    FolderError,
    read_manifest,
    sha256,
)
from .build_merge import Resolve, apply, plan_rebuild
from .lower import lower
from . import runtime_tree
from .features import left_out, runtime_modules
from .render import render


def runtime_files(modules: set[str] | None = None, without=frozenset()) -> dict[str, bytes]:
    """The source files of parc's runtime a build needs, as ``parc_runtime/...`` → bytes
    (``runtime_tree.files``: the modules the program uses, by their own names
    (``features.runtime_modules``), and what they import at module level, but those in
    ``without`` (``features.left_out``); None: every file)."""
    return runtime_tree.files(modules, without)


def spec_hash(spec) -> str:
    from parc.dsl import spec_to_dict

    # The values only: where the file lies (``source``) must not change the build.
    values = {k: v for k, v in spec_to_dict(spec).items() if k != "source"}
    return sha256(json.dumps(values, sort_keys=True).encode())


# Note [the build records its --set]: a build made with ``--set`` values records them in
# its manifest (``"set"``, in order; absent without any), beside the hash of the spec they
# made. ``parc build --check`` / ``--diff`` and ``parc verify DIR`` given no ``--set`` of
# their own apply the recorded ones, so a folder is judged against the layout it was built
# with, not the planner's; their hints repeat them.


def generate(spec, plan=None, overrides=()) -> dict[str, bytes]:
    """Everything a build folder holds, path → bytes (the manifest included; the base
    texts are these same bytes, added by ``with_bases`` when written).

    ``plan``: the spec's lowered ``Plan`` when the caller has it already (lowered once);
    ``overrides``: the ``--set`` values ``spec`` was loaded with (Note [the build records its --set])."""
    plan = lower(spec) if plan is None else plan
    files = {path: text.encode() for path, text in render(plan).items()}
    files.update(runtime_files(runtime_modules(plan), left_out(plan)))
    manifest = {
        "format": FORMAT,
        "parc_version": __version__,
        "spec": plan.source,
        "spec_sha256": spec_hash(spec),
        "files": {path: sha256(data) for path, data in sorted(files.items())},
    }
    if overrides:
        manifest["set"] = list(overrides)
    files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    return dict(sorted(files.items()))


def seen_from(spec, out_dir):
    """``spec`` with its token file's path (and ``train.init``'s checkpoint) as ``out_dir/train.py`` finds it.

    A relative path in a spec is relative to the spec's folder (``Spec.resolve``); the
    trainer resolves ``DATA_PATH`` against its own folder, so the build records the path
    from ``out_dir`` to the file: the printed ``cd OUT && torchrun ...`` works, and no
    absolute path enters the build (an absolute one written in the spec stays as is)."""
    from dataclasses import replace

    data = spec.train.data

    def seen(path):
        if isinstance(path, tuple):  # a blend's files
            return tuple(seen(p) for p in path)
        if path is None or os.path.isabs(path):
            return path
        return Path(os.path.relpath(spec.resolve(path), out_dir)).as_posix()

    init = spec.train.init_from  # train.init = checkpoint(dir): the same, resolved from train.py's folder
    if seen(data.path) == data.path and seen(data.val_path) == data.val_path and seen(init) == init:
        return spec
    data = replace(data, path=seen(data.path), val_path=seen(data.val_path))
    return replace(spec, train=replace(spec.train, data=data, init_from=seen(init)))


def load_built(spec_path, overrides, out_dir):
    """The spec as ``parc build SPEC -o OUT_DIR --set ...`` builds it (the token file's
    path seen from ``out_dir``, ``seen_from``): what its manifest's hash is of, for the
    build, ``build_to`` and ``parc verify DIR`` alike. Raises ``Diagnostics``."""
    from parc.dsl import load

    return seen_from(load(str(spec_path), list(overrides)), Path(out_dir))


def build_to(spec_path, out_dir, overrides=(), *, force: bool = True) -> Path:
    """Load, lower, render and write a build; for tests and benchmarks.

    Raises ``Diagnostics`` on spec errors. ``force`` (default on here) replaces edits
    that do not merge (saving them as ``.orig``); without it they raise ``FileExistsError``.
    """
    out_dir = Path(out_dir)
    spec = load_built(spec_path, overrides, out_dir)
    rebuild = plan_rebuild(out_dir, generate(spec, overrides=tuple(overrides)))
    if not force and (rebuild.blocked or rebuild.unmanaged):
        raise FileExistsError(f"{out_dir}: edits that do not merge: {[f.path for f in rebuild.blocked]}")
    apply(out_dir, rebuild, Resolve.FORCE)
    return out_dir
