"""One rank of a batch launch: several generated trainers, one after another, in one process.

Takes (argv): a JSON file ``{"runs": [{"train": ".../train.py", "args": [...], "logs":
"DIR", "cwd": "BUILD", "env": {...}}, ...]}`` written by ``batch.py``; torchrun's RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT. Gives: each run's own outputs (its ``--metrics-jsonl``), and in its
``logs`` folder ``rank<r>.log`` (this rank's stdout and stderr during the run) and
``rank<r>.done`` once the run returned with its ``exit_status`` (0 unless a case expects a
refusal). Not shipped: the trainers stay plain scripts.

Note [one launch, many trainers]: starting torchrun, importing torch and importing
torch._dynamo (which torch.optim does on the first ``add_param_group``) cost most of a
parity run's seconds; the steps cost a fraction of one. Here every run executes its
``train.py`` exactly as ``python train.py ARGS`` would (``runpy`` as ``__main__``, its
folder first on ``sys.path``, ``sys.argv`` its flags), and between runs the process is
put back as a fresh one would be:
- the previous build's ``parc_runtime`` modules are dropped from ``sys.modules`` (each
  build ships its own subset; the kernels' custom ops are re-registered by torch);
- the default CPU generator gets the state it had when the process started;
- the SIGTERM handler the trainer installed is put back;
- every run gets a fresh rendezvous: rank 0 starts a new TCPStore on a free port and
  publishes the port in torchrun's own store, and every rank points ``MASTER_PORT`` at
  it, so no key of an earlier process group is ever read again. The trainer itself
  destroys its process groups when it ends (``mesh.shutdown``), and this worker checks
  that their threads are gone (a group that outlives the trainer can abort the
  process at exit: Note [groups die before Python does] in runtime/distributed/mesh.py).
Two costs of a fresh process are not a fresh process's behaviour, so they are paid once
here:
- compiling the runtime's sources: every build is its own folder, so Python found no
  bytecode and compiled each ``parc_runtime`` module again for every run (about a fifth of
  a run's seconds). ``cached_compile`` keeps each source's code object by its bytes and
  hands later runs a copy renamed to their own file, so tracebacks name the run's files;
- the trainer's full garbage collection at its end (``mesh.shutdown``) walked every object
  torch made at import, each run again. ``gc.freeze()`` moves what exists before the first
  run, and again after the first run's imports, out of the collector's sight (those objects
  live for the whole process anyway); each run's own objects are still collected.
A run that raises (or exits with another status than its case expects) ends this
process with exit 1 after writing its traceback to its log; torchrun then stops the other ranks and ``batch.py`` launches the runs after it
again.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.machinery
import json
import os
import runpy
import signal
import sys
import time
import traceback
import types
from datetime import timedelta

import torch
import torch.distributed as dist

STORE_TIMEOUT = timedelta(minutes=5)


def _renamed(code: types.CodeType, path: str) -> types.CodeType:
    consts = tuple(_renamed(c, path) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=path, co_consts=consts)


def cached_compile() -> None:
    """Compile each distinct source once in this process (Note [a launch's fixed costs])."""
    compiled: dict[bytes, types.CodeType] = {}
    compile_source = importlib.machinery.SourceFileLoader.source_to_code

    def source_to_code(self, data, path, *args, **kwargs):
        if not isinstance(data, bytes) or args or kwargs:
            return compile_source(self, data, path, *args, **kwargs)
        code = compiled.get(data)
        if code is None:
            code = compiled[data] = compile_source(self, data, path)
        return code if code.co_filename == path else _renamed(code, path)

    importlib.machinery.SourceFileLoader.source_to_code = source_to_code


def purge_runtime() -> None:
    for name in [name for name in sys.modules if name == "parc_runtime" or name.startswith("parc_runtime.")]:
        del sys.modules[name]


@contextlib.contextmanager
def output_to(path: str):
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def fresh_rendezvous(launch_store, index: int, rank: int):
    """Point MASTER_PORT at a new store for run ``index``; rank 0 returns the server it hosts."""
    key = f"parc-batch/{index}/port"
    server = None
    if rank == 0:
        server = dist.TCPStore(os.environ["MASTER_ADDR"], 0, is_master=True, timeout=STORE_TIMEOUT)
        launch_store.set(key, str(server.port))
    os.environ["MASTER_PORT"] = launch_store.get(key).decode()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # every rank a client, rank 0's server above
    return server


def wait_for_all(launch_store, index: int, world_size: int) -> None:
    """Every rank has finished run ``index`` (so rank 0 may close its store)."""
    key = f"parc-batch/{index}/finished"
    launch_store.add(key, 1)
    while launch_store.add(key, 0) < world_size:
        time.sleep(0.01)


def gloo_threads() -> int:
    """Gloo worker threads alive in this process (one per connection loop and per worker)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as file:
            names.append(file.read().strip())
    return sum(name.startswith(("pt_gloo", "gloo_")) for name in names)


def run_one(run: dict, rank: int, rng_state) -> None:
    purge_runtime()
    folder = os.path.dirname(os.path.abspath(run["train"]))
    path = list(sys.path)  # a wrapping script may add the build folder (tests/checkpoint/reshard_worker.py)
    cwd, environ = os.getcwd(), dict(os.environ)
    for key, value in run["env"].items():  # None: unset (batch.py's Case.env)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.chdir(run["cwd"])  # where a user runs it: the build folder (checkpoints/ by default land there)
    sys.path[0] = folder
    sys.argv = [run["train"], *run["args"]]
    torch.set_rng_state(rng_state)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        runpy.run_path(run["train"], run_name="__main__")
        left = gloo_threads()
        if left:  # Note [groups die before Python does] in runtime/distributed/mesh.py
            raise RuntimeError(f"{left} gloo threads outlived the trainer: something still holds a process group")
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.path[:] = path
        signal.signal(signal.SIGTERM, sigterm)
        if dist.is_initialized():  # the trainer ended early: leave no group to the next run
            dist.destroy_process_group()


def main() -> int:
    with open(sys.argv[1]) as file:
        runs = json.load(file)["runs"]
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    launch_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=STORE_TIMEOUT
    )
    rng_state = torch.get_rng_state()
    cached_compile()
    gc.collect()
    gc.freeze()
    for index, run in enumerate(runs):
        if index == 1:  # the first run's imports (torch._dynamo, ...) stay too
            purge_runtime()
            gc.collect()
            gc.freeze()
        server = fresh_rendezvous(launch_store, index, rank)
        with output_to(os.path.join(run["logs"], f"rank{rank}.log")):
            try:
                run_one(run, rank, rng_state)
                status = 0
            except SystemExit as exc:  # what `python train.py` would have exited with
                status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
                if not isinstance(exc.code, (int, type(None))):  # the interpreter prints a message
                    print(exc.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - any error ends this run, as it would end train.py
                traceback.print_exc()
                status = 1
            failed = status != run.get("exit_status", 0)
            if failed:
                print(f"batch_worker: the trainer exited with {status}, not {run.get('exit_status', 0)}", file=sys.stderr)
        if failed:
            gc.unfreeze()
            return 1
        wait_for_all(launch_store, index, world_size)
        open(os.path.join(run["logs"], f"rank{rank}.done"), "w").close()
        del server
    gc.unfreeze()  # the interpreter's end frees them as a fresh process's would (triton's bindings count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
