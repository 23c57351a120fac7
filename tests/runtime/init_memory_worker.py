"""One simulated rank of the llama-7b example builds its model shard (test helper).

    python init_memory_worker.py TP RANK LAYER

Joins a fake process group (torch's "fake" backend: no peers, no traffic) as rank
RANK of a tensor-parallel group of TP, builds pipeline stage LAYER of the example's
32 layers (one block per stage) through ``model.build_stage`` — the trainer's path:
``Transformer`` then ``param_init.initialize`` — and prints JSON: the bytes of the
parameters it holds, the peak bytes of live CPU tensors while building (every tensor
any aten op created, tracked by a TorchDispatchMode until its storage dies), the
elements initialized and the seconds it took.
"""

from __future__ import annotations

import ast
import json
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from parc.codegen.lower import lower
from parc.codegen.render import render
from parc.dsl import load
from parc.runtime import model
from parc.runtime.model_desc import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


class LiveBytes(TorchDispatchMode):
    """The peak of bytes held by CPU storages created while active."""

    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak = weakref.WeakSet(), 0, 0

    def _freed(self, nbytes):
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                if storage not in self.live:
                    self.live.add(storage)
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, storage.nbytes())
        return out


def main(tp: int, rank: int, layer: int) -> None:
    plan = lower(load(str(ROOT / "examples" / "llama-7b.par"), []))
    config = ModelConfig(**{s.name.lower(): s.value for s in plan.model.settings})
    tree = ast.parse(render(plan)["train.py"])  # the trainer's own TP_PLAN literal
    tp_plan = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TP_PLAN")
    dist.init_process_group("fake", rank=rank, world_size=tp, store=FakeStore())
    try:
        stages = tuple((i, i + 1) for i in range(config.layers))
        tracker = LiveBytes()
        start = time.perf_counter()
        with tracker:
            stage = model.build_stage(
                config, stages=stages, index=layer, tp_group=dist.group.WORLD, sequence_parallel=True,
                tp_plan=tp_plan, seed=1, device="cpu", recompute="none", kernels="eager",
            )
        seconds = time.perf_counter() - start
        params = list(stage.parameters())
        print(json.dumps({
            "shard_bytes": sum(p.numel() * p.element_size() for p in params),
            "peak_bytes": tracker.peak,
            "elements": sum(p.numel() for p in params),
            "seconds": seconds,
            "std": float(stage.layers[str(layer)].attn.q_proj.weight.detach().std()),
        }))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
