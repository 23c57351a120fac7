"""The planner may recompute some blocks and not others (Note [per-layer recompute]).

The tiny GPT with micro-batches of 4 on dp 2 × tp 2 holds 13.9 MiB per rank without
recompute, 10.6 MiB with full recompute and 12.9 MiB with the first two blocks full
and the others not. With 14.5 MiB of device memory (13.8 usable) only full recompute
fits uniformly; the planner finds that two full blocks are enough, which is faster.
"""

from __future__ import annotations

from pathlib import Path

from parc.codegen.build import generate
from parc.codegen.planner.cost import hardware_for
from parc.codegen.planner.cost.estimate import USABLE_MEMORY
from parc.codegen.planner.cost.memory import memory
from parc.codegen.planner.search import search
from parc.dsl import load

ROOT = Path(__file__).resolve().parents[2]
SETS = ["parallel.recompute=auto", "train.micro_batch=4", "mesh.device_memory=14.5 MiB"]


def test_the_fewest_full_blocks_that_fit():
    spec = load(str(ROOT / "examples" / "tiny.par"), SETS)
    hw = hardware_for(spec)
    result = search(spec, hw)
    fitting = [item for item in result.estimates if item.fits]
    assert {item.layout.recompute for item in fitting} >= {"full", ("full", "full", "none", "none")}
    assert not any(item.layout.recompute in ("none", "selective") for item in fitting)
    mixed = next(item for item in fitting if item.layout.recompute == ("full", "full", "none", "none"))
    full = next(item for item in fitting if item.layout.recompute == "full" and item.layout.sp == mixed.layout.sp
                and item.layout.overlap == mixed.layout.overlap)
    assert mixed.time.step < full.time.step  # it recomputes half the blocks
    fewer = memory(spec, type(mixed.layout)(**{**_fields(mixed.layout), "recompute": ("full", "none", "none", "none")}))
    assert fewer.peak.total > hw.memory * USABLE_MEMORY  # one full block is not enough
    assert fitting[0].layout.settings_words() in (["rc:[full ×2, none ×2]"], ["rc:[full ×2, selective ×2]"])


def test_parc_build_of_an_auto_recompute_renders_the_mix():
    spec = load(str(ROOT / "examples" / "tiny.par"), SETS + ["parallel.overlap=none", "parallel.sp=false"])
    text = generate(spec)["train.py"].decode()
    assert 'RECOMPUTE = ("full",) * 2 + (' in text and "net = parallelize.recompute(net, RECOMPUTE)" in text
    assert "(planner)" in text


def _fields(layout) -> dict:
    return {name: getattr(layout, name) for name in layout.__dataclass_fields__}
