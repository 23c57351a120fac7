"""Model traits of current open models: ``model.head_dim`` apart from hidden / heads,
``qk_norm`` (Qwen3) and ``attention_bias`` (Qwen2), in-process, no launch.

The description (model_desc.py) counts what the runtime builds; the check rules place a
bad value at its spec line; and the names are transformers' own: a Qwen2 and a Qwen3
model of random weights, made by ``transformers`` from their configs, are read through
``parc import``'s config keys and ``hf_names.links`` into parc's plain model, whose loss
is transformers' on the same tokens (head_dim 12 on hidden 32 with 4 heads, so a width
taken from hidden / heads anywhere would fail); ``hf_config`` gives the config back.
"""

from __future__ import annotations

import pytest
import torch

from parc.codegen import hf_import, hf_names
from parc.dsl import Diagnostics, load_text
from parc.dsl.diagnostics import SourceMap, render
from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import describe
from parc.runtime.layout.saved_elements import block_saved_elements
from parc.runtime.models import model

TRAITS = dict(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=250, padded_vocab=256,
              seq_len=16, tie_embeddings=False, head_dim=12)


@pytest.mark.parametrize("qk_norm, attention_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_the_description_counts_what_the_model_builds(qk_norm, attention_bias):
    config = model.ModelConfig(**TRAITS, qk_norm=qk_norm, attention_bias=attention_bias)
    net = model.build_model(config)
    built = {name: tuple(p.shape) for name, p in net.named_parameters()}
    described = {f"{m.name}.{p.name}": p.shape for m in describe(config).modules for p in m.params
                 if m.tied_to is None}
    assert built == described
    assert built["layers.0.attn.q_proj.weight"] == (48, 32) and built["layers.0.attn.o_proj.weight"] == (32, 48)
    assert ("layers.1.attn.k_norm.weight" in built) is qk_norm
    assert ("layers.1.attn.v_proj.bias" in built) is attention_bias and "layers.1.attn.o_proj.bias" not in built
    assert model_counts.parameters(describe(config)) == sum(p.numel() for p in net.parameters())


def test_tp_splits_the_heads_and_biases_and_keeps_the_head_norms_whole():
    config = model.ModelConfig(**TRAITS, qk_norm=True, attention_bias=True)
    desc = describe(config)
    q, k_norm = desc.module("layers.0.attn.q_proj"), desc.module("layers.0.attn.k_norm")
    assert [p.local_shape(2) for p in q.params] == [(24, 32), (24,)]
    assert k_norm.style is None and k_norm.numel(2) == 12 and not k_norm.weight.sequence_parallel
    block = desc.blocks[0]
    assert block.core_flops_per_token(16) == 4.0 * 4 * 12 * 16  # heads · head_dim, not hidden
    assert desc.stage_params(2).elements < model_counts.parameters(desc)  # the column biases split with their rows


def _spec(model_lines: str, parallel: str = "dp = 1\n  tp = 1\n  pp = 1") -> str:
    return f"""model m {{
  arch = llama
  layers = 2
  hidden = 32
  heads = 4
  ffn = 64
  vocab = 256
  seq_len = 16
{model_lines}
}}
mesh {{
  nodes = 1
  devices_per_node = 1
  device = cpu
}}
parallel {{
  {parallel}
}}
train {{
  global_batch = 2
  micro_batch = 1
  steps = 2
  optimizer = adamw(lr = 1e-3)
  precision = fp32
  data = synthetic
}}
"""


def _errors(text: str) -> list[str]:
    """Each diagnostic of ``text`` as the user sees it."""
    sources = SourceMap()
    with pytest.raises(Diagnostics) as caught:
        load_text(text, "m.par", sources=sources)
    return [render(e, sources) for e in caught.value.errors]


def test_an_odd_head_dim_under_rotary_is_reported_at_its_line():
    [error] = _errors(_spec("  head_dim = 11"))
    assert error.startswith("m.par:9:") and "PAR0226" in error and "head_dim = 11 is odd" in error
    assert "try head_dim = 12" in error


def test_qk_norm_with_gpt_is_reported_at_its_line():
    [error] = _errors(_spec("  attention_bias = false\n  qk_norm = true").replace("arch = llama", "arch = gpt"))
    assert error.startswith("m.par:10:") and "PAR0227" in error and "arch = llama only" in error


def test_head_dim_frees_heads_from_dividing_hidden():
    text = _spec("  head_dim = 8\n  qk_norm = true\n  attention_bias = true").replace("heads = 4", "heads = 3")
    spec = load_text(text, "m.par")
    assert (spec.model.heads, spec.model.head_dim, spec.model.qk_norm, spec.model.attention_bias) == (3, 8, True, True)
    assert spec.model.desc.module("layers.0.attn.q_proj").weight.shape == (24, 32)
    assert "PAR0202" in _errors(text.replace("  head_dim = 8\n", ""))[0]  # without it, heads must divide hidden


QWEN = dict(vocab_size=250, max_position_embeddings=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=12, intermediate_size=64, tie_word_embeddings=False)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_a_qwen_model_reads_into_parc_and_gives_transformers_loss(kind):
    transformers = pytest.importorskip("transformers")
    config_class, arch = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[kind]
    hf_cfg = getattr(transformers, config_class)(**QWEN, architectures=[arch])
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with torch.no_grad():  # random biases and norm weights: not the 0s and 1s of init
        for name, p in hf.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.5)

    found, rows = hf_import.parc_model(hf_cfg.to_dict())
    keys = {key: value for key, value, _ in rows}
    assert found == kind and keys["head_dim"] == 12
    assert keys.get("qk_norm", False) is (kind == "qwen3") and keys.get("attention_bias", False) is (kind == "qwen2")
    config = model.ModelConfig(**{**keys, "padded_vocab": 256})
    parc_keys = {f: getattr(config, f) for f in model.ModelConfig.__dataclass_fields__}
    written = hf_names.hf_config(parc_keys)  # export's config.json: the same model to transformers
    assert written["model_type"] == kind and written["head_dim"] == 12
    assert getattr(transformers, config_class)(**written).head_dim == 12

    net = model.init_weights(model.build_model(config), seed=0, device="cpu")
    state, params = hf.state_dict(), dict(net.named_parameters())
    linked = set()
    for link in hf_names.links(parc_keys):
        tensors = hf_names.from_hf(link, [state[n] for n in link.hf], [tuple(params[n].shape) for n in link.parc])
        for name, tensor in zip(link.parc, tensors):
            params[name].data.copy_(tensor)
            linked.add(name)
    assert linked == set(params)  # every parc tensor has its Hugging Face name

    tokens = torch.randint(0, 250, (2, 16), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(hf(inputs).logits.flatten(0, 1), targets.flatten())
        loss = net(inputs, targets)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


def test_both_traits_have_no_hugging_face_names():
    with pytest.raises(hf_names.NoHfNames, match="o_proj"):
        hf_names.model_type({**TRAITS, "qk_norm": True, "attention_bias": True})


def test_verify_shrinks_a_written_head_dim_with_the_heads():
    from parc.codegen.shrink import shrink

    text = _spec("  kv_heads = 2\n  head_dim = 32\n  qk_norm = true\n  attention_bias = true")
    changes = {c.key: c.after for c in shrink(load_text(text, "m.par"), steps=2).changes}
    assert changes["model.head_dim"] == "8" and changes["model.hidden"] == str(int(changes.get("model.heads", 4)) * 8)


def test_saved_activations_follow_the_heads_width():
    """Note [what parc's trainer saves]: q, its output and k, v are heads·head_dim and
    kv_heads·head_dim wide; a gpt block at tp 2 saves (2·Δq + 2·Δk) / 2 more per token."""
    base = dict(TRAITS, arch="gpt", kv_heads=4, head_dim=None)
    plain, wide = describe(model.ModelConfig(**base)), describe(model.ModelConfig(**{**base, "head_dim": 16}))
    saved = [block_saved_elements(d.config, d.blocks[0], tp=2, sp=False, recompute="none", micro_batch=1)
             for d in (plain, wide)]
    assert saved[1] - saved[0] == (2 * (64 - 32) + 2 * (64 - 32)) / 2
    normed = describe(model.ModelConfig(**{**TRAITS, "qk_norm": True}))
    bare = describe(model.ModelConfig(**TRAITS))
    extra = [block_saved_elements(d.config, d.blocks[0], tp=1, sp=False, recompute="none", micro_batch=1)
             for d in (bare, normed)]
    assert extra[1] - extra[0] == 2 * (4 + 2) * 12 + 4 + 2  # input and x·rstd of each head, one rstd a head


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_parc_import_then_export_of_a_qwen_folder_gives_back_every_tensor(kind, tmp_path):
    """The command line both ways: config.json's keys (head_dim; Qwen's fixed ones) into
    model.par, the weights into a checkpoint, and ``parc export`` gives the same tensors."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from parc.codegen.cli import main as parc_main

    config_class = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[kind]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**QWEN))
    hf.save_pretrained(tmp_path / "hf")
    assert parc_main(["import", str(tmp_path / "hf"), "-o", str(tmp_path / "out")]) == 0
    spec = (tmp_path / "out" / "model.par").read_text()
    assert "head_dim = 12" in spec and ("qk_norm = true" in spec) is (kind == "qwen3")
    assert parc_main(["export", "--to", "safetensors", str(tmp_path / "out" / "checkpoint"), str(tmp_path / "back")]) == 0
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(before) == sorted(after) and all(torch.equal(before[k], after[k]) for k in before)
    back = transformers.AutoConfig.from_pretrained(tmp_path / "back")
    assert back.model_type == kind and back.head_dim == 12
