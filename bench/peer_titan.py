"""bench/peer.py's torchtitan side: torchtitan 0.3.0's own Trainer on CPU, gloo.

Run by bench/peer.py under torchrun with torchtitan on PYTHONPATH (bench/.peer/site,
made by ``python bench/peer.py --setup``); not importable from the project's venv.
Builds a ``Trainer.Config`` in Python, as torchtitan's config registry does
(models/llama3/config_registry.py), with:

- a Llama3 model of the given shapes from torchtitan's own building blocks
  (``_build_llama3_layers``: RMSNorm, GQA attention with rotary, SwiGLU FeedForward),
  the MLP width passed exactly (``hidden_dim = --ffn``, no ``multiple_of`` rounding),
  un-fused q/k/v like parc's, SDPA (``is_causal``) as inner attention like parc's
  (torchtitan's language-model default is FlexAttention with document masks);
- synthetic tokens (a loader of random ids, as parc's ``data = synthetic``) and a
  tokenizer stand-in: the Trainer builds both, and neither may read files here;
- no activation checkpointing, no checkpoints, no validation, no compile, fp32;
- with ``--experts E`` a MoE in every block instead (``--moe-ffn`` wide experts,
  ``--top-k``, softmax router with renormalized top-k weights, no shared experts,
  torchtitan's load-balancing bias update on, as its Qwen3-MoE builds it): torchtitan's
  Qwen3 block (its MoE model family) without q/k norms, un-fused q/k/v, SDPA, so the
  attention is the Llama one; ``--ep`` experts split over that many ranks (torchtitan
  borrows them from the FSDP degree: ``--dp-kind shard``);
- with ``--pp 2`` its pipeline (``--schedule``: 1F1B, Interleaved1F1B, ZBVZeroBubble,
  ...), the layers split evenly over the stages (no stage holds fewer for the
  embedding or the head, as parc splits them), ``--micro-batch`` rows a micro-batch,
  the whole batch of a dp rank one step of micro-batches (no accumulation around it);
- with ``--cp 2`` its context parallelism (ring attention over SDPA, the sequence
  in load-balanced chunks);
- dp through torchtitan's FSDP2 (``data_parallel_shard_degree``, its default) or
  replication (``--dp-kind replicate``), tp through its DTensor plan (sp off).

Trainer.train_step is timed per step (after a barrier); rank 0 prints one JSON line
{"tokens_per_s": median over steps after warm-up, ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass


class _CpuDevice:
    """torch.cpu with the memory calls torchtitan's metrics make of a device module
    (components/metrics.DeviceMemoryMonitor): CPU has no allocator statistics."""

    def __getattr__(self, name):
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None):
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        import types

        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return types.SimpleNamespace(total_memory=pages, name="cpu")

    @staticmethod
    def current_device():
        return 0  # an index, as barrier(device_ids=...) takes (distributed/utils.set_pg_timeouts)

    @staticmethod
    def memory_stats(device=None):
        return {}

    @staticmethod
    def reset_peak_memory_stats(device=None):
        pass

    @staticmethod
    def empty_cache():
        pass


def _cpu_device() -> None:
    """torchtitan picks ``cuda`` when no accelerator is found (tools/utils.get_device_info);
    bind ``cpu`` before any module copies the name."""
    import torchtitan.tools.utils as titan_utils

    titan_utils.device_type, titan_utils.device_module = "cpu", _CpuDevice()
    import torchtitan.distributed.utils as titan_dist

    # After step 1 the Trainer shortens the groups' timeouts through
    # torch.distributed.set_timeout, which torch 2.13 does not have: timeouts only.
    titan_dist.set_pg_timeouts = lambda **_: None


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("hidden", 128), ("heads", 4), ("kv_heads", 4), ("ffn", 512),
                          ("vocab", 512), ("seq_len", 64), ("micro_batch", 2), ("global_batch", 16),
                          ("dp", 1), ("tp", 1), ("steps", 8), ("warmup", 2), ("experts", 0), ("top_k", 2),
                          ("moe_ffn", 0), ("ep", 1), ("pp", 1), ("cp", 1)]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--norm-eps", type=float, default=1e-5)
    parser.add_argument("--dp-kind", choices=("shard", "replicate"), default="shard")
    parser.add_argument("--schedule", default="1F1B", help="torchtitan's pipeline schedule (with --pp > 1)")
    parser.add_argument("--dump", default="/tmp/parc-peer-titan")
    parser.add_argument("--profile", action="store_true",
                        help="profile the first step after warm-up; rank 0 prints the ops by self time")
    args = parser.parse_args()
    _cpu_device()

    D = args.hidden // args.heads
    if args.experts:
        spec = _moe_spec(args, D)
    else:
        spec = _llama_spec(args, D)
    _train(args, spec)


def _moe_spec(args, D):
    """torchtitan's Qwen3-MoE block with the Llama attention (no q/k norms): see the docstring."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import (
        make_gqa_config, make_moe_config, make_routed_experts_config, make_router_config,
    )
    from torchtitan.models.qwen3 import (
        _LINEAR_INIT, _moe_experts_init, _qwen3_norm, _residual_output_init, model_registry,
    )
    from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

    layers = []
    for _ in range(args.layers):
        layers.append(Qwen3TransformerBlock.Config(
            attention_norm=_qwen3_norm(args.hidden), ffn_norm=_qwen3_norm(args.hidden),
            attention=make_gqa_config(
                dim=args.hidden, n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=D,
                wqkv_param_init=_LINEAR_INIT, wo_param_init=_residual_output_init(args.layers),
                inner_attention=ScaledDotProductAttention.Config(), fuse_qkv=False,
                rope=CosSinRoPE.Config(dim=D, max_seq_len=args.seq_len, theta=args.rope_theta)),
            moe=make_moe_config(
                num_experts=args.experts,
                router=make_router_config(dim=args.hidden, num_experts=args.experts, gate_param_init=_LINEAR_INIT,
                                          top_k=args.top_k, score_func="softmax", route_norm=True),
                routed_experts=make_routed_experts_config(
                    dim=args.hidden, hidden_dim=args.moe_ffn, num_experts=args.experts, top_k=args.top_k,
                    param_init=_moe_experts_init(args.layers), comm_backend="standard")),
        ))
    for layer in layers:
        layer.attention_norm.eps = layer.ffn_norm.eps = args.norm_eps
    spec = model_registry("debugmodel_moe", attn_backend="flex")  # the layers above replace its model
    spec.model = Qwen3Model.Config(
        vocab_size=args.vocab, dim=args.hidden, norm=_qwen3_norm(args.hidden),
        tok_embeddings=Embedding.Config(num_embeddings=args.vocab, embedding_dim=args.hidden,
                                        param_init=spec.model.tok_embeddings.param_init),
        lm_head=Linear.Config(in_features=args.hidden, out_features=args.vocab, param_init=_LINEAR_INIT),
        layers=layers)
    spec.flavor = "parc-peer-moe"
    return spec


def _llama_spec(args, D):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import _build_llama3_layers, model_registry
    from torchtitan.models.llama3.model import Llama3Model

    layers = _build_llama3_layers(
        fuse_qkv=False, n_layers=args.layers, dim=args.hidden, n_heads=args.heads, n_kv_heads=args.kv_heads,
        hidden_dim=args.ffn,  # exact: no compute_ffn_hidden_dim rounding
        rope=ComplexRoPE.Config(dim=D, max_seq_len=args.seq_len, theta=args.rope_theta, scaling="none"),
        attn_backend="flex")
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention_norm.eps = layer.ffn_norm.eps = args.norm_eps
    model = Llama3Model.Config(
        dim=args.hidden, vocab_size=args.vocab,
        tok_embeddings=Embedding.Config(num_embeddings=args.vocab, embedding_dim=args.hidden),
        norm=RMSNorm.Config(normalized_shape=args.hidden, eps=args.norm_eps),
        lm_head=Linear.Config(in_features=args.hidden, out_features=args.vocab),
        layers=layers)
    spec = model_registry("debugmodel", attn_backend="flex")
    spec.model, spec.flavor = model, "parc-peer"
    return spec


def _train(args, spec):
    import torch
    import torch.distributed as dist
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.components.tokenizer import BaseTokenizer
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.trainer import Trainer

    SyntheticTokens, NoTokenizer = _data_classes(torch, BaseDataLoader, BaseTokenizer)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    shard, replicate = (args.dp, 1) if args.dp_kind == "shard" else (1, args.dp)
    config = Trainer.Config(
        model_spec=spec,
        dump_folder=args.dump,
        loss=CrossEntropyLoss.Config(global_vocab_size=args.vocab),
        tokenizer=NoTokenizer.Config(vocab=args.vocab),
        dataloader=SyntheticTokens.Config(vocab=args.vocab, positions=args.cp > 1),
        optimizer=default_adamw(lr=3e-4),
        # under pp the local batch is the micro-batches of a step; else one micro-batch, accumulated
        training=TrainingConfig(local_batch_size=args.global_batch // args.dp if args.pp > 1 else args.micro_batch,
                                global_batch_size=args.global_batch,
                                seq_len=args.seq_len, steps=args.warmup + args.steps, max_norm=1.0,
                                dtype="float32", mixed_precision_param="float32", disable_cuda_graphs=True),
        parallelism=ParallelismConfig(data_parallel_shard_degree=shard, data_parallel_replicate_degree=replicate,
                                      tensor_parallel_degree=args.tp, enable_sequence_parallel=False,
                                      expert_parallel_degree=args.ep,
                                      context_parallel_degree=args.cp,
                                      pipeline_parallel_degree=args.pp, pipeline_parallel_schedule=args.schedule,
                                      pipeline_parallel_microbatch_size=args.micro_batch,
                                      pipeline_parallel_first_stage_less_layers=0,
                                      pipeline_parallel_last_stage_less_layers=0,
                                      # the default, spmd_types, hands FSDP (dp > 1) plain parameters
                                      # on CPU and FSDP refuses them; DTensor for tp as before 0.3
                                      spmd_backend="partial_dtensor" if world > 1 else "spmd_types"),
        metrics=MetricsProcessor.Config(log_freq=1),
        activation_checkpoint=None,
    )
    assert shard * replicate * args.tp * args.pp * args.cp == world, (shard, replicate, args.tp, args.pp, args.cp)
    trainer = config.build()
    if world > 1 and shard > 1:
        _gloo_reductions(trainer)
    if args.pp > 1:
        _micro_batch_steps(trainer.pp_schedule)
    times = []
    step = trainer.train_step

    def timed_step(data_iterator):
        if dist.is_initialized():
            dist.barrier()
        profiling = args.profile and len(times) == args.warmup
        profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiling else None
        start = time.perf_counter()
        with profile or contextlib.nullcontext():
            step(data_iterator)
        if dist.is_initialized():
            dist.barrier()
        times.append(time.perf_counter() - start)
        if profile is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)

    trainer.train_step = timed_step
    params = sum(p.numel() for p in trainer.model_parts[0].parameters())
    trainer.train()
    trainer.close()
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        median = statistics.median(times[args.warmup:])
        print(json.dumps({"tokens_per_s": args.global_batch * args.seq_len / median, "step_time_s": median,
                          "local_parameters": params}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def _gloo_reductions(trainer) -> None:
    """FSDP2 reduce-scatters with ``ReduceOp.PREMUL_SUM`` once a gradient divide factor is
    set (torchtitan sets 1.0 on every FSDP module: distributed/fsdp.py), and gloo has no
    PREMUL_SUM. ``set_force_sum_reduction_for_comms`` makes it a SUM with the division
    done locally: the same bytes on the wire, the same arithmetic up to rounding."""
    for part in trainer.model_parts:
        for module in part.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)


def _micro_batch_steps(schedule) -> None:
    """torchtitan 0.3.0 hands its schedule the micro-batches already split
    (``step(arg_mbs=, kwarg_mbs=, target_mbs=)``); the pinned torch's ``step`` takes the
    whole batch and splits it itself, so those lists would arrive as model keywords.
    Route them to the schedule's ``_step_microbatches``, after the per-step reset its
    ``step`` does (each stage's backward flag and run-time state)."""
    whole_batch = schedule.step

    def step(*args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
             loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None:
            return whole_batch(*args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs, **kwargs)
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        for stage in stages:
            stage.has_backward = schedule._has_backward
            stage.clear_runtime_states()
        schedule._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)

    schedule.step = step


def _data_classes(torch, BaseDataLoader, BaseTokenizer):
    """The loader and tokenizer stand-ins the Trainer builds (synthetic tokens)."""

    class SyntheticTokens(BaseDataLoader):
        """Random token ids, (B, T) inputs and their (B, T) next-token labels."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab: int = 512
            positions: bool = False
            """Hand each token's position too (torchtitan's cp shards them with the tokens)."""

        def __init__(self, config, *, dp_rank, local_batch_size, seq_len, **_):
            self.vocab, self.shape = config.vocab, (local_batch_size, seq_len + 1)
            self.gen = torch.Generator().manual_seed(1 + dp_rank)
            self.positions = torch.arange(seq_len).expand(local_batch_size, seq_len) if config.positions else None

        def __iter__(self):
            while True:
                tokens = torch.randint(0, self.vocab, self.shape, generator=self.gen)
                inputs = {"input": tokens[:, :-1]}
                if self.positions is not None:
                    inputs["positions"] = self.positions.clone()
                yield inputs, tokens[:, 1:]

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    class NoTokenizer(BaseTokenizer):
        """The Trainer builds a tokenizer; synthetic tokens need none."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            vocab: int = 512

        def __init__(self, config, **_):
            super().__init__()
            self.vocab = config.vocab

        def encode(self, *args, **kwargs):
            raise NotImplementedError

        def decode(self, *args, **kwargs):
            raise NotImplementedError

        def get_vocab_size(self):
            return self.vocab

    return SyntheticTokens, NoTokenizer


if __name__ == "__main__":
    main()
