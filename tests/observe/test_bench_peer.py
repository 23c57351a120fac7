"""bench/peer.py's helpers (the bench itself is not a test: no test imports torchtitan)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from parc.dsl import load

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_peer", ROOT / "bench" / "peer.py")
peer = importlib.util.module_from_spec(_spec)
sys.modules["bench_peer"] = peer  # dataclasses look their module up
_spec.loader.exec_module(peer)


def test_titan_ffn_rounds_as_torchtitan_does():
    assert peer.titan_ffn(128, 256) == 512  # int(2/3·512) = 341 → 512
    assert peer.titan_ffn(256, 256) == 768  # its debug model
    assert peer.titan_ffn(4096, 1024, 1.3) == 14336  # Llama 3 8B


def test_spec_states_the_shapes_exactly(tmp_path):
    shapes = peer.Shapes()
    path = tmp_path / "peer.par"
    path.write_text(peer.spec_text(shapes, peer.LAYOUTS["dp2xtp2"], steps=4))
    spec = load(str(path))
    m = spec.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq_len) == (
        shapes.layers, shapes.hidden, shapes.heads, shapes.kv_heads, shapes.ffn, shapes.vocab, shapes.seq_len)
    assert (spec.parallel.dp, spec.parallel.tp) == (2, 2)


@pytest.mark.parametrize("name", sorted(peer.LAYOUTS))
def test_every_layouts_spec_is_what_it_names(tmp_path, name):
    """Each family's spec passes parc's checks with the layout's degrees (and, for the
    MoE ones, the experts torchtitan is given), on as many devices as ranks."""
    shapes, layout = peer.Shapes(), peer.LAYOUTS[name]
    path = tmp_path / "peer.par"
    path.write_text(peer.spec_text(shapes, layout, steps=4))
    spec = load(str(path))
    p = spec.parallel
    assert (p.dp, p.tp, p.pp, p.cp, p.ep, p.zero) == (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep,
                                                      layout.zero)
    assert spec.mesh.devices_per_node == layout.ranks
    assert spec.train.precision.value == layout.precision
    if layout.moe:
        m = spec.model
        assert (m.experts, m.top_k, m.expert_ffn, m.shared_experts) == (
            shapes.experts, shapes.top_k, shapes.ffn, shapes.shared_experts)
