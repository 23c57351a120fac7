"""One rank of the step-scalars test (started by ``ranks.launch`` on 2 gloo ranks).

    python step_scalars_worker.py OUT_DIR

The two ranks are a pipeline, rank 1 its last stage (the one holding the loss). Each
case runs the step's tail twice on the same gradients: apart (the clip's all-reduce,
``StepGuard.check``'s MAX over the world, ``loss_over_pipeline``) and as one all-reduce
(Note [one all-reduce after backward]: ``summands``, ``clip_grad_norm_(summed=)``,
``check(signalled=)``), and writes what each gave to ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from parc.runtime.distributed import mesh
from parc.runtime.optimizers import optim
from parc.runtime.parallel.pipeline.pipeline import loss_over_pipeline
from parc.runtime.train.faults import StepGuard

CASES = {  # the last stage's loss, is rank 1 signalled, a NaN gradient on rank 0
    "finite": (2.5, False, False),
    "negative loss": (-0.75, False, False),
    "nan loss": (math.nan, False, False),
    "nan gradient": (2.5, False, True),
    "sigterm on one rank": (2.5, True, False),
}


def gradients(rank: int, nan: bool) -> torch.nn.Module:
    torch.manual_seed(rank)
    stage = torch.nn.Linear(8, 8)
    for p in stage.parameters():
        p.grad = torch.randn_like(p) * 3
    if nan:
        stage.weight.grad[0, 0] = math.nan
    return stage


def tail(rank: int, group, loss_of_last: float, sigterm: bool, nan: bool, fused: bool) -> dict:
    guard = StepGuard("skip", rank=rank, world_size=2, device="cpu")
    guard.signalled = sigterm and rank == 1
    loss = loss_of_last if rank == 1 else 0.0
    stage = gradients(rank, nan and rank == 0)
    if fused:
        summed = guard.summands(loss)
        norm = optim.clip_grad_norm_(stage, 1.0, tp_group=None, pp_group=group, summed=summed)
        loss, signalled = summed.tolist()
        take = guard.check(3, loss, norm, signalled=signalled)
    else:
        norm = optim.clip_grad_norm_(stage, 1.0, tp_group=None, pp_group=group)
        take = guard.check(3, loss, norm)
        loss = loss_over_pipeline(loss, group)
    return {"norm": repr(norm), "loss": repr(loss), "take": take, "stopping": guard.stopping,
            "grads": [p.grad.flatten().tolist() for p in stage.parameters()]}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    results = {name: {"apart": tail(rank, group, *case, fused=False), "fused": tail(rank, group, *case, fused=True)}
               for name, case in CASES.items()}
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()


if __name__ == "__main__":
    main()
    mesh.shutdown()  # after main's objects are gone (Note [groups die before Python does])
