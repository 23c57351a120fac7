"""One simulated rank of the llama-7b example builds its model shard (test helper).

    python init_memory_worker.py TP RANK LAYER
    python init_memory_worker.py zero3 DP


Joins a fake process group (torch's "fake" backend: no peers, no traffic) as rank
RANK of a tensor-parallel group of TP, builds pipeline stage LAYER of the example's
32 layers (one block per stage) through ``model.build_stage`` — the trainer's path:
``Stage`` then ``model.init_weights`` — and prints JSON: the bytes of the
parameters it holds, the peak bytes of live CPU tensors while building (every tensor
any aten op created, tracked by a TorchDispatchMode until its storage dies), the
elements initialized and the seconds it took. ``zero3 DP``: the example's layout with
``zero = 3`` over DP data-parallel ranks instead (tp 4, pp 2; this is rank 1 of the
first tp group and stage): the model is built on the meta device and
``fsdp.FullyShardedAdamW`` generates this rank's slices; "shard_bytes" is then the
parameter slices plus the Adam moments it allocates next to them.
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
from parc.runtime.parallel.data import fsdp
from parc.runtime.models import model
from parc.runtime.models.pipeline_stages import Stage
from parc.runtime.layout.model_desc import ModelConfig
import built  # noqa: E402  (tests/runtime/built.py)
from init_reference import init_values  # noqa: E402  (tests/runtime/init_reference.py)

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


def example():
    """The llama-7b example's model config and the trainer's own TP_PLAN literal."""
    plan = lower(load(str(ROOT / "examples" / "llama-7b.par"), []))
    config = ModelConfig(**{s.name.lower(): s.value for s in plan.model.settings})
    tree = ast.parse(render(plan)["train.py"])
    tp_plan = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TP_PLAN")
    return config, tp_plan


def zero3(dp: int) -> None:
    config, tp_plan = example()
    tp, pp = 4, 2  # rank 1 = tp rank 1 of dp rank 0, stage 0 (tp innermost, pp outermost)
    dist.init_process_group("fake", rank=1, world_size=tp * dp * pp, store=FakeStore())
    try:
        tp_group = dist.new_group(list(range(tp)))
        dp_group = dist.new_group(list(range(1, tp * dp, tp)))
        pp_group = dist.new_group([1, 1 + tp * dp])
        half = config.layers // 2
        tracker = LiveBytes()
        start = time.perf_counter()
        with tracker:
            net = built.build(
                config, stages=((0, half), (half, config.layers)), pp_rank=0, pp_size=pp, tp_group=tp_group,
                sequence_parallel=True, tp_plan=tp_plan, seed=1, device="cpu", kernels="eager", materialize=False,
            )
            optimizer = fsdp.FullyShardedAdamW(net, dp_group=dp_group, tp_group=tp_group, lr=1e-4, betas=(0.9, 0.95),
                                               weight_decay=0.1, eps=1e-8, pp_group=pp_group)
        seconds = time.perf_counter() - start
        kept = [optimizer.flat, *optimizer.state.values(), optimizer.decay, optimizer.tp_mask, optimizer.counted,
                optimizer.expert_mask]  # the masks: one bool per element of the shard (experts: None if dense)
        unit = optimizer.units[0]  # the embedding's unit: this rank's slice of its tp rows
        embed = init_values("embed.weight", (config.padded_vocab, config.hidden), layers=config.layers, seed=1,
                            offsets=(config.padded_vocab // tp, 0), shape=(config.padded_vocab // tp, config.hidden))
        print(json.dumps({
            "shard_bytes": sum(t.numel() * t.element_size() for t in kept if torch.is_tensor(t)),
            "live_bytes": tracker.now,
            "param_bytes": optimizer.resident_param_bytes(),
            "first_unit": unit.name,
            "embed_slice_equal": bool(torch.equal(unit.shard, embed.reshape(-1)[: unit.shard_numel])),
            "peak_bytes": tracker.peak,
            "elements": optimizer.flat.numel(),
            "stage_elements": sum(p.numel() for p in net.parameters()),
            "seconds": seconds,
            "std": float(unit.shard.std()),
        }))
        del optimizer, net
    finally:
        dist.destroy_process_group()


def main(tp: int, rank: int, layer: int) -> None:
    config, tp_plan = example()
    dist.init_process_group("fake", rank=rank, world_size=tp, store=FakeStore())
    try:
        stages = tuple((i, i + 1) for i in range(config.layers))
        tracker = LiveBytes()
        start = time.perf_counter()
        with tracker:
            with torch.device("meta"):  # one virtual stage of the plain model, as build_stages makes each
                stage = Stage(config, layers=stages[layer], first=layer == 0, last=layer == len(stages) - 1)
            stage = built.transform(stage, tp_group=dist.group.WORLD, sequence_parallel=True, tp_plan=tp_plan,
                                    recompute="none")
            stage = model.init_weights(stage, seed=1, device="cpu")
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
    if sys.argv[1] == "zero3":
        zero3(int(sys.argv[2]))
    else:
        main(*(int(a) for a in sys.argv[1:4]))
