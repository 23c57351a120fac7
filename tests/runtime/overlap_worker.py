"""One rank of the overlap tests (started by ``ranks.launch`` on 2 gloo ranks).

    python overlap_worker.py OUT_DIR

With the two ranks as one tp group, each check builds the tiny GPT and Llama of
``runtime_loop`` in float64, runs one forward/backward of a micro-batch of 4 with
``sub_batches`` 1 and 2 and compares the loss and every gradient; it also counts
the collectives a step issues with and without ``recompute = full``. With the two
ranks as one dp group, it compares overlapped gradient buckets (two micro-batches
accumulated) with the blocking ones. Writes ``OUT_DIR/rank{r}.json``:
``{name: "ok" | traceback}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_loop import CONFIGS, tp_plan  # noqa: E402

from parc.runtime.distributed import comm, comm_async, mesh  # noqa: E402
from parc.runtime.train import data  # noqa: E402
from parc.runtime.parallel.data import dp, hetero  # noqa: E402
from parc.runtime.models import model  # noqa: E402
import built  # noqa: E402  (tests/runtime/built.py)

MICRO_BATCH = 4


def batch(config, seed):
    dataset = data.SyntheticTokens(config.vocab, config.seq_len, seed=seed)
    return dataset.batch(list(range(seed * MICRO_BATCH, (seed + 1) * MICRO_BATCH)))


def step(arch, group, *, sp, sub_batches, recompute, steps=1):
    """Loss, grads by name and collectives issued, for forward/backward of ``steps`` batches."""
    config = CONFIGS[arch]
    net = built.build(config, tp_group=group, sequence_parallel=sp, tp_plan=tp_plan(arch),
                            seed=11, device=torch.device("cpu"), recompute=recompute,
                            sub_batches=sub_batches).double()
    comm.exposed_clock.reset()
    losses = []
    for s in range(steps):
        loss = net(*batch(config, s))
        loss.backward()
        losses.append(loss.item())
    if sp:
        model.allreduce_sequence_parallel_grads(net, group)
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    return losses, grads, comm.exposed_clock.collectives


def check_sub_batches(group, arch, sp, recompute):
    losses, grads, _ = step(arch, group, sp=sp, sub_batches=1, recompute="none")
    got_losses, got_grads, _ = step(arch, group, sp=sp, sub_batches=2, recompute=recompute)
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), rtol=1e-12, atol=0)
    assert got_grads.keys() == grads.keys(), sorted(set(got_grads) ^ set(grads))
    for name in grads:
        torch.testing.assert_close(got_grads[name], grads[name], rtol=1e-10, atol=1e-12,
                                   msg=lambda m, name=name: f"{name}: {m}")


def check_recompute_collectives(group, arch, sp):
    """Note [fine-grained recompute]: recompute reruns no collective."""
    _, _, plain = step(arch, group, sp=sp, sub_batches=2, recompute="none")
    _, _, recomputed = step(arch, group, sp=sp, sub_batches=2, recompute="full")
    assert recomputed == plain, f"{recomputed} collectives with recompute = full, {plain} without"
    _, _, unsplit = step(arch, group, sp=sp, sub_batches=1, recompute="none")
    _, _, unsplit_recomputed = step(arch, group, sp=sp, sub_batches=1, recompute="full")
    # the unsplit full recompute reruns each block's forward collectives: the count can tell
    assert unsplit_recomputed > unsplit, (unsplit_recomputed, unsplit)


def check_schedule(group, arch, sp):
    """Note [the sub-batch schedule]: every forward collective but the last is waited only
    after a later collective was launched (some compute ran while it was in flight)."""
    config = CONFIGS[arch]
    net = built.build(config, tp_group=group, sequence_parallel=sp, tp_plan=tp_plan(arch), seed=11,
                            device=torch.device("cpu"), sub_batches=2)
    events, launches, kept = [], {}, []
    originals = {name: getattr(comm_async, name) for name in ("launch_all_reduce", "launch_reduce_scatter",
                                                                "launch_all_gather")}
    original_wait = comm.Pending.wait

    def recording(name):
        def launch(*args, **kwargs):
            pending = originals[name](*args, **kwargs)
            kept.append(pending)  # alive, so no two share an id()
            launches[id(pending)] = len(launches)
            events.append(("launch", launches[id(pending)]))
            return pending
        return launch

    def wait(pending):
        if id(pending) in launches:
            events.append(("wait", launches[id(pending)]))
        return original_wait(pending)

    from parc.runtime.parallel.tensor import overlap
    try:
        for name in originals:
            setattr(overlap, name, recording(name))
        comm.Pending.wait = wait
        with torch.no_grad():
            net(*batch(config, 0))
    finally:
        for name, fn in originals.items():
            setattr(overlap, name, fn)
        comm.Pending.wait = original_wait
    per_block = 4 * (2 if sp else 1)  # 2 regions × 2 sub-batches × (reduce [+ gather])
    assert len(launches) == per_block * config.layers, (len(launches), events)
    position = {event: index for index, event in enumerate(events)}
    last = len(launches) - 1
    for n in range(len(launches)):
        assert ("wait", n) in position, f"collective {n} never waited: {events}"
        between = events[position[("launch", n)] + 1 : position[("wait", n)]]
        if n != last:
            assert any(kind == "launch" for kind, _ in between), f"collective {n} waited at once: {events}"


def check_hetero(dist_info, arch, sp):
    """Per-layer tp (Note [heterogeneous layouts]): block 0 at tp 1 (the embedding with it, so
    the model's tp group is none), block 1 at tp 2. ``sub_batches = 2`` splits only block 1,
    whose collectives run over its own tp group, and gives the unsplit run's numbers."""
    config = CONFIGS[arch]
    grid = mesh.Mesh((("dp", 1), ("tp", 2)), dist_info)
    layouts = hetero.StageLayouts(grid, (1, 2))
    runs, groups = [], []
    original = comm_async.launch_all_reduce if not sp else comm_async.launch_reduce_scatter
    name = "launch_all_reduce" if not sp else "launch_reduce_scatter"
    from parc.runtime.parallel.tensor import overlap

    def recording(tensor, group, *args, **kwargs):
        groups.append(group)
        return original(tensor, group, *args, **kwargs)

    for sub_batches in (1, 2):
        net = built.build(config, tp_group=layouts.tp_group(2), sequence_parallel=sp, tp_plan=tp_plan(arch),
                                seed=11, device=torch.device("cpu"), sub_batches=sub_batches,
                                layouts=layouts).double()
        assert comm.group_size(net.tp_group) == 1, "the embedding's layout is tp 1"
        setattr(overlap, name, recording)
        try:
            loss = net(*batch(config, 0))
            loss.backward()
        finally:
            setattr(overlap, name, original)
        if sp:
            hetero.allreduce_sequence_parallel_grads(net, layouts)
        runs.append((loss.item(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}))
    # block 1's 2 regions × 2 sub-batches, forward (row) and backward (column input grads),
    # all over the tp-2 group; block 0 unsplit
    assert len(groups) == 8, len(groups)
    assert all(g is layouts.tp_group(2) for g in groups), groups
    (loss, grads), (got_loss, got_grads) = runs
    torch.testing.assert_close(torch.tensor(got_loss), torch.tensor(loss), rtol=1e-12, atol=0)
    assert got_grads.keys() == grads.keys()
    for n in grads:
        torch.testing.assert_close(got_grads[n], grads[n], rtol=1e-10, atol=1e-12, msg=lambda m, n=n: f"{n}: {m}")


def check_gradient_overlap(group, arch, accumulations):
    config = CONFIGS[arch]
    results = []
    for overlap in (False, True):
        net = built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=11,
                                device=torch.device("cpu")).double()
        buckets = dp.GradientBuckets(net, group, bucket_bytes=16384, overlap=overlap,
                                     accumulations=accumulations)
        for _ in range(2):  # two optimizer steps: the counts must reset
            for micro in range(accumulations):
                net(*batch(config, dist_rank(group) * 10 + micro)).backward()
            if overlap:
                assert len(buckets._inflight) == len(buckets.buckets), "some bucket waited for finish()"
            buckets.finish()
        results.append({name: p.grad.clone() for name, p in net.named_parameters()})
    for name in results[0]:
        torch.testing.assert_close(results[1][name], results[0][name], rtol=1e-12, atol=1e-14,
                                   msg=lambda m, name=name: f"{name}: {m}")


def dist_rank(group):
    return torch.distributed.get_rank(group)


def main(out_dir: Path) -> None:
    dist_info = mesh.init_distributed()
    group = torch.distributed.new_group(list(range(dist_info.world_size)))
    result = {}

    def attempt(name, fn, *args):
        try:
            fn(*args)
            result[name] = "ok"
        except Exception:  # recorded per check and reported by the test
            result[name] = traceback.format_exc()

    for arch in ("gpt", "llama"):
        for sp in (False, True):
            for recompute in ("none", "selective", "full"):
                attempt(f"sub_batches {arch} sp={sp} recompute={recompute}", check_sub_batches, group, arch, sp,
                        recompute)
            attempt(f"recompute collectives {arch} sp={sp}", check_recompute_collectives, group, arch, sp)
            attempt(f"schedule {arch} sp={sp}", check_schedule, group, arch, sp)
        for sp in (False, True):
            attempt(f"hetero {arch} sp={sp}", check_hetero, dist_info, arch, sp)
        for accumulations in (1, 2):
            attempt(f"gradient overlap {arch} accumulations={accumulations}", check_gradient_overlap, group,
                    arch, accumulations)
    (out_dir / f"rank{dist_info.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    mesh.shutdown()  # after main's objects are gone (Note in runtime/distributed/mesh.py)
