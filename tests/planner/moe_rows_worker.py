"""One rank of tests/planner/test_moe_rows.py (started by tests/runtime/ranks.launch).

    python moe_rows_worker.py OUT_DIR

For each case of ``CASES`` (sp, ep) builds a one-block Llama MoE Transformer over a tp
group of the whole world (sequence parallel or not; the experts split over the same
ranks when ep > 1, ep folded onto tp), runs one forward of a (2, 8) micro-batch, and
writes ``OUT_DIR/rank{r}.json``: ``{"sp1 ep2": rows, ...}``, the rows this rank's MoE
block handed to its experts' exchange (what ``MoEMLP.dispatch_and_run`` received), the
runtime's count the planner's ``routed_rows`` must equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from parc.runtime.distributed import mesh
from parc.runtime.parallel.expert import moe
from parc.runtime.layout.model_desc import ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
import built  # noqa: E402  (tests/runtime/built.py)

CONFIG = dict(arch="llama", layers=1, hidden=16, heads=2, kv_heads=2, ffn=24, vocab=32, padded_vocab=32,
              seq_len=8, experts=4, top_k=2, tie_embeddings=False)
MICRO_BATCH = 2
PLAN = {"embed": "vocab", "head": "vocab_head", "layers.*.attn.q_proj": "colwise",
        "layers.*.attn.k_proj": "colwise", "layers.*.attn.v_proj": "colwise", "layers.*.attn.o_proj": "rowwise"}


CASES = ((True, 1), (True, 2), (False, 2), (False, 1))
"""(sp, ep) on a tp group of the world."""


def main(out_dir: Path) -> None:
    info = mesh.init_distributed()
    group = dist.new_group(list(range(info.world_size)))
    rows = []
    original = moe.MoEMLP.dispatch_and_run

    def counted(self, x, counts, sizes=None):
        rows.append(int(x.shape[0]))
        return original(self, x, counts, sizes)

    moe.MoEMLP.dispatch_and_run = counted
    tokens = torch.randint(0, CONFIG["vocab"], (MICRO_BATCH, CONFIG["seq_len"]),
                           generator=torch.Generator().manual_seed(0))
    result = {}
    for sp, ep in CASES:
        model = built.build(ModelConfig(**CONFIG), tp_group=group, sequence_parallel=sp, tp_plan=PLAN,
                            ep_group=group if ep > 1 else None, seed=3, kernels="eager")
        rows.clear()
        with torch.no_grad():
            model(tokens, tokens)
        result[f"sp{int(sp)} ep{ep}"] = sum(rows)
    (out_dir / f"rank{info.rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
