"""From text to Spec: values, defaults, presets, units, auto, --set, JSON specs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from parc.dsl import Diagnostics, load, load_text, schema, spec_to_dict
from parc.dsl.normalize import normalize_document
from parc.dsl.parse import parse
from parc.dsl.spec import Arch, DataKind, LrScheduleKind, PipelineSchedule, Precision, Recompute

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.par"


def tiny(*replacements: tuple[str, str]) -> str:
    text = TINY.read_text(encoding="utf-8")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def codes(text: str, overrides=(), file: str = "t.par") -> list[str]:
    with pytest.raises(Diagnostics) as caught:
        load_text(text, file, overrides)
    return [e.code for e in caught.value.errors]


def test_tiny() -> None:
    spec = load(str(TINY))
    assert spec.source == str(TINY)
    assert spec.model.name == "gpt_tiny" and spec.model.arch is Arch.GPT
    assert (spec.model.layers, spec.model.hidden, spec.model.heads) == (4, 128, 4)
    assert spec.model.kv_heads == 4 and spec.model.tie_embeddings is True
    assert spec.model.padded_vocab == 512
    assert spec.mesh.world_size == 4 and spec.mesh.device == "cpu"
    assert spec.mesh.device_memory is None and spec.mesh.device_flops is None
    assert spec.mesh.intra_node == 10e9 and spec.mesh.inter_node == 1.25e9
    assert (spec.parallel.dp, spec.parallel.tp, spec.parallel.pp) == (2, 2, 1)
    assert spec.parallel.schedule is PipelineSchedule.ONE_F_ONE_B and spec.parallel.chunks == 1
    assert spec.parallel.recompute is Recompute.NONE and spec.parallel.overlap == 1
    assert spec.parallel.is_complete
    assert spec.grad_accum() == 4
    assert spec.train.optimizer.lr == 3e-4 and spec.train.optimizer.betas == (0.9, 0.95)
    assert spec.train.lr_schedule.kind is LrScheduleKind.COSINE
    assert spec.train.lr_schedule.warmup == 2
    assert spec.train.precision is Precision.FP32 and spec.train.seed == 1234
    assert spec.train.data.kind is DataKind.SYNTHETIC


def test_spans_list_every_written_key_sorted() -> None:
    spec = load_text(tiny(), "tiny.par")
    keys = [key for key, _ in spec.spans]
    assert keys == sorted(keys)
    assert "model.name" in keys and "train.optimizer.lr" in keys and "parallel.tp" in keys
    assert "model.kv_heads" not in keys  # defaulted, not written
    tp = spec.span("parallel.tp")
    assert (tp.file, tp.line, tp.column) == ("tiny.par", 22, 8)


def test_units_resolve_to_si() -> None:
    spec = load_text(
        tiny(
            (
                "device = cpu",
                "device = cpu\n  intra_node = 16 GB/s\n  inter_node = 200 Gb/s\n"
                "  device_memory = 2 GiB\n  device_flops = 1.5 TFLOPS\n"
                "  intra_node_latency = 3 us\n  inter_node_latency = 2 ms",
            )
        ),
        "t.par",
    )
    mesh = spec.mesh
    assert mesh.intra_node == 16e9 and mesh.inter_node == 25e9
    assert mesh.device_memory == 2 * 2**30 and mesh.device_flops == 1.5e12
    assert mesh.intra_node_latency == pytest.approx(3e-6)
    assert mesh.inter_node_latency == pytest.approx(2e-3)


def test_presets() -> None:
    spec = load(str(ROOT / "examples" / "gpt2-small.par"))
    assert spec.mesh.device_flops == 312e12 and spec.mesh.device_memory == 80e9
    assert spec.mesh.intra_node == 300e9 and spec.mesh.inter_node == 25e9
    assert spec.model.padded_vocab == 50304
    assert spec.train.data.path == "data/openwebtext/train.bin"


def test_llama_defaults() -> None:
    spec = load(str(ROOT / "examples" / "llama-7b.par"))
    assert spec.model.arch is Arch.LLAMA and spec.model.tie_embeddings is False
    assert spec.model.kv_heads == 8 and spec.parallel.sp is True
    assert spec.mesh.inter_node == 50e9


def test_parallel_auto() -> None:
    spec = load(str(ROOT / "examples" / "gpt3-175b.par"))
    parallel = spec.parallel
    assert (parallel.dp, parallel.tp, parallel.pp, parallel.sp, parallel.zero) == (None,) * 5
    assert parallel.schedule is None and parallel.recompute is None
    assert parallel.overlap is None and not parallel.is_complete
    assert spec.grad_accum() is None


def test_micro_batch_auto() -> None:
    spec = load_text(tiny(("micro_batch = 2", "micro_batch = auto")), "t.par")
    assert spec.train.micro_batch is None and spec.grad_accum() is None
    assert spec.parallel.is_complete and not spec.layout_complete
    assert spec.span("train.micro_batch") is not None


def test_some_degrees_auto_skip_their_checks() -> None:
    spec = load_text(
        tiny(("tp = 2", "tp = auto")), "t.par", ["parallel.dp=3", "train.global_batch=12", "mesh.devices_per_node=6"]
    )
    assert spec.parallel.tp is None and spec.parallel.dp == 3


def test_auto_degrees_that_no_layout_completes_are_refused() -> None:
    """dp = 3 on 4 devices: no tp · pp completes it, so parc check says what the planner would (PAR0801)."""
    with pytest.raises(Diagnostics) as caught:
        load_text(tiny(("tp = 2", "tp = auto")), "t.par", ["parallel.dp=3", "train.global_batch=12"])
    (error,) = caught.value.errors
    assert error.code == "PAR0801" and error.span.file == "--set 1"
    assert error.message == (
        "the planner found no valid layout for this mesh and batch: no choice of tp passes the "
        "rules on 4 devices with dp = 3, pp = 1, micro_batch = 2"
    )


def test_an_unwritten_zero_is_the_check_s_zero_as_the_build_s() -> None:
    """parc check reads an unwritten zero (and recompute) as parc build does, 0 (none): a rule
    that reads it refuses the spec in both, not in the build alone."""
    with pytest.raises(Diagnostics) as caught:
        load_text(tiny(), "t.par", ["parallel.zero_shard=node"])
    assert [error.code for error in caught.value.errors] == ["PAR0241"]


def test_set_overrides_and_adds() -> None:
    spec = load_text(
        tiny(),
        "t.par",
        [
            "parallel.dp=1",
            "parallel.pp=2",
            "parallel.schedule=interleaved(chunks = 2)",
            "mesh.device=a100-80gb",
            "mesh.intra_node=300 GB/s",
            'train.data=tokens("data/x.bin", dtype = uint32)',
            "model.name=other",
            "train.steps=5",
            "train.steps=7",
        ],
    )
    assert spec.parallel.schedule is PipelineSchedule.INTERLEAVED and spec.parallel.chunks == 2
    assert spec.mesh.device == "a100-80gb" and spec.mesh.intra_node == 300e9
    assert spec.mesh.device_flops == 312e12
    assert spec.train.data.path == "data/x.bin" and spec.train.data.dtype == "uint32"
    assert spec.model.name == "other" and spec.train.steps == 7
    span = spec.span("train.steps")
    assert (span.file, span.line, span.column) == ("--set 9", 1, 13)


def test_set_a_key_of_parallel_auto() -> None:
    text = (ROOT / "examples" / "gpt3-175b.par").read_text(encoding="utf-8")
    spec = load_text(text, "g.par", ["parallel.tp=8"])
    assert spec.parallel.tp == 8 and spec.parallel.dp is None and spec.parallel.zero is None
    spec = load_text(tiny(), "t.par", ["parallel=auto"])
    assert spec.parallel.dp is None


def test_set_fixes_a_bad_value_in_the_file() -> None:
    load_text(tiny(("tp = 2", "tp = 3")), "t.par", ["parallel.tp=2"])


def test_set_into_a_missing_block() -> None:
    text = tiny().split("\ntrain {")[0]
    spec = load_text(
        text, "t.par", ["train.global_batch=8", "train.micro_batch=2", "train.steps=1"]
    )
    assert spec.train.global_batch == 8 and spec.grad_accum() == 2


def test_errors_are_all_collected_and_sorted() -> None:
    found = codes(tiny(("layers = 4", "layers = 0"), ("dp = 2", "dp = 3")), ["parallel.tp=3"])
    assert found == ["PAR0201", "PAR0203", "PAR0109", "PAR0208"]


def test_json_spec_gives_the_same_spec() -> None:
    doc = normalize_document(parse(tiny(), "tiny.par")).doc
    text = json.dumps(doc, indent=2)
    jsonschema.validate(doc, schema())
    from_json = load_text(text, "tiny.json")
    assert spec_to_dict(from_json) | {"source": ""} == spec_to_dict(load(str(TINY))) | {
        "source": ""
    }
    span = from_json.span("parallel.tp")
    assert text.split("\n")[span.line - 1].strip().startswith('"tp"')
    overridden = load_text(text, "tiny.json", ["parallel.tp=1", "parallel.dp=4"])
    assert overridden.parallel.dp == 4


ROUND_TRIP = [
    (),
    ("parallel=auto",),
    ("parallel.tp=auto", "train.micro_batch=auto"),
    ("parallel.dp=1", "parallel.pp=2", "parallel.schedule=interleaved(chunks = 2)"),
    ("parallel.tp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = [32, 16, 16])"),
    ("parallel.recompute=[full, none, selective, none]", "parallel.overlap=[sub_batch(2), none, none, none]"),
    ("parallel.dp=1", "parallel.pp=2", "parallel.stage_layers=[1, 3]"),
    ("parallel.zero=3", "parallel.zero_shard=node", "parallel.zero_prefetch=2"),  # keys only zero = 3 reads
    ('train.data=tokens("d/x.bin", dtype = uint32)', 'train.checkpoint=every(5, dir = "ck")'),
    ("train.schedule=constant(warmup = 3)", "mesh.device_memory=8 GB", 'mesh.profile="p.json"'),
]


@pytest.mark.parametrize("example", sorted(p.stem for p in (ROOT / "examples").glob("*.par")))
def test_emit_spec_is_the_json_spec_format(example, tmp_path, capsys) -> None:
    """`parc build --emit spec` prints a .json spec that `parc check` reads as the same Spec."""
    from parc.codegen.cli import main

    path = ROOT / "examples" / f"{example}.par"
    for sets in ROUND_TRIP if example == "tiny" else [()]:
        overrides = [arg for s in sets for arg in ("--set", s)]
        assert main(["build", str(path), "--emit", "spec", *overrides]) == 0
        emitted = tmp_path / f"{example}.json"
        emitted.write_text(capsys.readouterr().out)
        assert main(["check", str(emitted)]) == 0, (sets, capsys.readouterr().err)
        capsys.readouterr()
        again = spec_to_dict(load(str(emitted))) | {"source": ""}
        assert again == spec_to_dict(load(str(path), list(sets))) | {"source": ""}, sets


def test_a_call_without_kind_hints_its_own_functions(tmp_path) -> None:
    doc = normalize_document(parse(tiny(), "tiny.par")).doc
    doc["train"]["optimizer"] = {"lr": 0.001}
    with pytest.raises(Diagnostics) as caught:
        load_text(json.dumps(doc, indent=2), "tiny.json")
    (error,) = caught.value.errors
    assert (error.message, error.hint) == (
        '`train.optimizer` needs "kind"', 'e.g. {"kind": "adamw"}; kind is one of adamw')


def test_spec_to_dict_is_json() -> None:
    for path in sorted((ROOT / "examples").glob("*.par")):
        view = spec_to_dict(load(str(path)))
        assert json.loads(json.dumps(view)) == view
    view = spec_to_dict(load(str(TINY)))
    assert view["parallel"]["schedule"] == "1f1b" and view["model"]["arch"] == "gpt"
    assert "spans" not in view


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    assert set(schema()["properties"]) == {"model", "mesh", "parallel", "train"}


def test_docs_describe_every_key() -> None:
    from parc.dsl.keys import BLOCKS

    docs = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    for block in BLOCKS.values():
        section = docs.split(f"### `{block.name}")[1].split("\n### ")[0]
        for key in block.keys:
            assert f"| `{key.name}` |" in section, f"docs/language.md lacks {block.name}.{key.name}"


@pytest.mark.parametrize(
    "device, hint",
    [
        ("h100", "did you mean `h100-80gb`?"),  # by meaning, not h200 by spelling
        ("h200-141gb", "did you mean `h200`?"),
        ("3090", "did you mean `rtx3090`?"),
        ("a100", "expected one of"),  # 40 or 80 GB: no one guess
    ],
)
def test_an_unknown_device_is_suggested_by_meaning(device, hint) -> None:
    with pytest.raises(Diagnostics) as caught:
        load(str(TINY), [f"mesh.device={device}"])
    (error,) = caught.value.errors
    assert error.code == "PAR0108" and error.hint.startswith(hint), error.hint


def test_uneven_terapipe_slices_are_their_lengths() -> None:
    """`terapipe(slices = [n0, n1, ...])`: the slices' tokens (the paper's uneven slices);
    `slices` is their count. Written as the issue's --set, and in the file, formatted."""
    sets = ["parallel.tp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = [32, 16, 16])"]
    spec = load(str(TINY), sets)
    assert spec.parallel.schedule is PipelineSchedule.TERAPIPE
    assert (spec.parallel.slices, spec.parallel.slice_lengths) == (3, (32, 16, 16))
    even = load(str(TINY), [*sets[:2], "parallel.schedule=terapipe(slices = 4)"])
    assert (even.parallel.slices, even.parallel.slice_lengths) == (4, None)
    text = tiny(("tp = 2", "tp = 1"), ("pp = 1", "pp = 2\n  schedule = terapipe(slices = [32,16,16])"))
    assert load_text(text, "t.par").parallel.slice_lengths == (32, 16, 16)
    from parc.dsl import format_document

    assert "schedule = terapipe(slices = [32, 16, 16])" in format_document(parse(text, "t.par"))


@pytest.mark.parametrize("slices,code", [("[32, 16, 8]", "PAR0265"), ("[64, 0]", "PAR0109"),
                                         ("[64]", "PAR0116"), ("[32, 32.5]", "PAR0107")])
def test_uneven_terapipe_slices_refused(slices, code) -> None:
    sets = ["parallel.tp=1", "parallel.pp=2", f"parallel.schedule=terapipe(slices = {slices})"]
    assert codes(tiny(), sets) == [code]
