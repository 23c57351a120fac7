"""``train.grad_reduce = bf16`` under ZeRO (runtime/parallel/data/zero.py, Note [bf16 reduction
under ZeRO]): at two gloo ranks every gradient reduction of ZeRO 1, 2 and 3 (and HSDP's sum
over the replicas) puts a bf16 tensor on the wire, the rank's shard stays fp32, and the
step's gradient norm is the fp32 reduction's within bf16 rounding.

The bound: bf16 keeps 8 significant bits, so each rounding errs by at most 2^-9 of the
value rounded. A rank's gradient is rounded once before the sum and the sum once after
(gloo sums the two bf16 values and rounds), so each element of the mean errs by at most
2^-9·(|g0| + |g1|)/2 + 2^-9·|g0 + g1|/2, and the norm by at most 2^-9·(‖g0‖ + ‖g1‖ +
‖g0 + g1‖)/2 ≤ 2^-8·(‖g0‖ + ‖g1‖)/2·2: about 0.8% where the two ranks' gradients do not
cancel. 1e-2 relative is that bound with room for a partial cancellation; an fp32 reduction
here differs from the bf16 one by far more than float noise (checked: the two are not equal).
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parc.runtime.distributed import mesh
from parc.runtime.models import model
from parc.runtime.parallel.data import fsdp, zero
from parc.runtime.train import data
import built  # noqa: E402  (tests/runtime/built.py)

CONFIG = model.ModelConfig(arch="llama", layers=1, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=61,
                           padded_vocab=64, seq_len=8)
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
KINDS = ("zero1", "zero2", "zero3", "zero3-node")
BOUND = 1e-2


def _optimizer(kind, net, reduce_dtype):
    world = dist.group.WORLD
    if kind == "zero3-node":  # HSDP with one rank a node: no reduce-scatter, the replicas' sum only
        return fsdp.FullyShardedAdamW(net, dp_group=None, replicate_group=world, tp_group=None,
                                      accumulations=2, reduce_dtype=reduce_dtype, **HYPER)
    if kind == "zero3":
        return fsdp.FullyShardedAdamW(net, dp_group=world, tp_group=None, accumulations=2,
                                      reduce_dtype=reduce_dtype, **HYPER)
    return zero.ShardedAdamW(net, dp_group=world, tp_group=None, stage=int(kind[-1]), accumulations=2,
                             reduce_dtype=reduce_dtype, **HYPER)


def _step(kind, rank, reduce_dtype):
    """One step of two micro-batches on this rank's half of the batch: (norm, the
    (dtype, elements) of every non-scalar all-reduce, the gradient shard's dtype)."""
    net = built.build(CONFIG, tp_group=None, sequence_parallel=False, tp_plan={}, seed=3, device="cpu",
                      kernels="eager")
    opt = _optimizer(kind, net, reduce_dtype)
    tokens = data.SyntheticTokens(CONFIG.vocab, CONFIG.seq_len, seed=1)
    sent, all_reduce = [], dist.all_reduce

    def spy(tensor, *args, **kwargs):
        if tensor.numel() > 1:  # the norm's squares and the like are scalars
            sent.append((str(tensor.dtype), tensor.numel()))
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = spy
    try:
        for micro in range(2):
            x, y = tokens.batch([4 * rank + 2 * micro, 4 * rank + 2 * micro + 1])
            (net(x, y) / 2).backward()
        norm = opt.reduce_gradients_and_clip(1e6)
    finally:
        dist.all_reduce = all_reduce
    return norm, sent, str(opt.grad.dtype)


def _worker(rank, world, store_path, out_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    torch.manual_seed(0)
    result = {kind: {str(dtype): _step(kind, rank, dtype) for dtype in (None, torch.bfloat16)} for kind in KINDS}
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(result, f)
    mesh.shutdown()  # the step's objects are gone (Note [groups die before Python does])


def test_zero_reductions_carry_bf16_and_keep_fp32_shards(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(tmp_path / "result")), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"result.{r}").read_text()) for r in range(2)]
    for kind in KINDS:
        (fp32_norm, fp32_sent, fp32_grad), (bf16_norm, bf16_sent, bf16_grad) = (
            results[0][kind][key] for key in ("None", "torch.bfloat16"))
        assert fp32_sent and bf16_sent, kind
        assert {dtype for dtype, _ in fp32_sent} == {"torch.float32"}, (kind, fp32_sent)
        assert {dtype for dtype, _ in bf16_sent} == {"torch.bfloat16"}, (kind, bf16_sent)
        # the same reductions, of the same sizes: only the dtype on the wire changed
        assert [n for _, n in fp32_sent] == [n for _, n in bf16_sent], kind
        assert fp32_grad == bf16_grad == "torch.float32", kind  # the shard the optimizer steps
        assert bf16_norm != fp32_norm, kind  # the rounding is real ...
        assert abs(bf16_norm - fp32_norm) <= BOUND * fp32_norm, (kind, bf16_norm, fp32_norm)  # ... and bounded
        assert results[1][kind]["torch.bfloat16"][0] == bf16_norm, kind  # the norm is global
