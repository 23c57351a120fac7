"""bench/peer.py's helpers (the bench itself is not a test: no test imports torchtitan)."""

import importlib.util
import sys
from pathlib import Path

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
    path.write_text(peer.spec_text(shapes, dp=2, tp=2, steps=4))
    spec = load(str(path))
    m = spec.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq_len) == (
        shapes.layers, shapes.hidden, shapes.heads, shapes.kv_heads, shapes.ffn, shapes.vocab, shapes.seq_len)
    assert (spec.parallel.dp, spec.parallel.tp) == (2, 2)
