"""Pass 1: every value the generated program will contain is of a safe, expected kind.

Takes: a ``Spec`` (validated by the front end, or built by hand). Gives: the draft
unchanged, or ``Diagnostics`` listing every problem. This is the code generator's own
guard against injection (DESIGN §8): names must be plain ASCII identifiers, numbers
exact ``int``/``float`` values that are finite and in range, strings exact ``str``
without control characters, closed vocabularies enum members. Later passes and the
renderer may then emit any value with ``repr`` and trust the result to be a literal.
Values that pass are then held to the rules of ``runtime/layout/constraints/`` (those
``parc check`` applies, buildability included; ``auto`` values are unknown to them), so
the planner never searches around a spec the front end would refuse.

Before: nothing. After: ``choose_layout``.
"""

from __future__ import annotations

import enum
import math
import re

from parc.dsl.spec import Arch, DataKind, DecayShape, LrScheduleKind, Precision, Recompute, Spec

from ..errors import BAD_NAME, BAD_VALUE, check, error
from ..spec_values import rule_errors
from .draft import Draft

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

MAX_SIZE = 2**31 - 1
"""Largest size, degree or count a build accepts (a bigger one is a typo, not a model)."""
MAX_SEED = 2**63 - 1
TOKEN_DTYPES = ("uint16", "uint32")


def run(spec: Spec, draft: Draft) -> Draft:
    problems: list = []

    def bad(key: str, message: str, hint: str | None = None, code: str = BAD_VALUE) -> None:
        problems.append(error(spec, key, code, message, hint))

    def count(key: str, value, *, low: int = 1, high: int = MAX_SIZE, auto: bool = False) -> None:
        if value is None and auto:
            return
        if type(value) is not int:
            bad(key, f"{key} must be a whole number, not {_show(value)}")
        elif not low <= value <= high:
            bad(key, f"{key} = {value} is out of range", f"{key} must be between {low} and {high}")

    def real(key: str, value, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if type(value) not in (int, float):
            bad(key, f"{key} must be a number, not {_show(value)}")
        elif not math.isfinite(value):
            bad(key, f"{key} = {value!r} is not a finite number")

    def member(key: str, value, kind: type[enum.Enum], *, auto: bool = False) -> None:
        if value is None and auto:
            return
        if not isinstance(value, kind):
            choices = ", ".join(m.value for m in kind)
            bad(key, f"{key} = {_show(value)} is not one of {choices}")

    model = spec.model
    name = model.name
    if type(name) is not str or not IDENTIFIER.fullmatch(name):
        bad(
            "model",
            f"model name {_show(name)} is not a plain identifier",
            "use ASCII letters, digits and underscores, not starting with a digit",
            BAD_NAME,
        )
    arch = model.config.arch  # the runtime record's word (Note [one model record]): an exact str
    if type(arch) is not str or arch not in {a.value for a in Arch}:
        bad("model.arch", f"model.arch = {_show(arch)} is not one of {', '.join(a.value for a in Arch)}")
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "pad_vocab_to"):
        count(f"model.{key}", getattr(model, key))
    for key in ("dropout", "norm_eps", "rope_theta"):
        real(f"model.{key}", getattr(model, key))
    if type(model.tie_embeddings) is not bool:
        bad("model.tie_embeddings", "model.tie_embeddings must be true or false")

    mesh = spec.mesh
    count("mesh.nodes", mesh.nodes)
    count("mesh.devices_per_node", mesh.devices_per_node)
    if type(mesh.device) is not str or not DEVICE_NAME.fullmatch(mesh.device):
        bad("mesh.device", f"mesh.device {_show(mesh.device)} is not a device name", code=BAD_NAME)
    for key in ("device_memory", "device_flops"):
        real(f"mesh.{key}", getattr(mesh, key), optional=True)
    for key in ("intra_node", "inter_node", "intra_node_latency", "inter_node_latency"):
        real(f"mesh.{key}", getattr(mesh, key))

    parallel = spec.parallel
    for key in ("dp", "tp", "pp"):
        count(f"parallel.{key}", getattr(parallel, key), auto=True)
    for key, values, one in (
        ("parallel.overlap", parallel.overlap, lambda v: count("parallel.overlap", v, auto=True)),
        ("parallel.recompute", parallel.recompute, lambda v: member("parallel.recompute", v, Recompute, auto=True)),
    ):
        if type(values) is tuple:  # Note [per-layer values]: one per block
            if len(values) != model.layers:
                bad(key, f"{key} has {len(values)} values for {model.layers} layers")
            for value in values:
                one(value)
        else:
            one(values)
    count("parallel.zero", parallel.zero, low=0, high=3, auto=True)
    count("parallel.chunks", parallel.chunks)
    if parallel.sp is not None and type(parallel.sp) is not bool:
        bad("parallel.sp", "parallel.sp must be true, false or auto")
    if parallel.stage_layers is not None:
        if type(parallel.stage_layers) is not tuple:
            bad("parallel.stage_layers", "parallel.stage_layers must be a list of whole numbers")
        else:
            for layers in parallel.stage_layers:
                count("parallel.stage_layers", layers)

    train = spec.train
    for key in ("global_batch", "steps", "log_every"):
        count(f"train.{key}", getattr(train, key))
    count("train.micro_batch", train.micro_batch, auto=True)
    count("train.seed", train.seed, low=0, high=MAX_SEED)
    real("train.grad_clip", train.grad_clip)
    member("train.precision", train.precision, Precision)
    optimizer = train.optimizer
    for key in ("lr", "weight_decay", "eps"):
        real(f"train.optimizer.{key}", getattr(optimizer, key))
    if type(optimizer.betas) is not tuple or len(optimizer.betas) != 2:
        bad("train.optimizer.betas", "train.optimizer betas must be a pair of numbers")
    else:
        for beta in optimizer.betas:
            real("train.optimizer.betas", beta)
    schedule = train.lr_schedule
    member("train.schedule", schedule.kind, LrScheduleKind)
    count("train.schedule.warmup", schedule.warmup, low=0)
    real("train.schedule.min_lr_ratio", schedule.min_lr_ratio)
    if type(schedule.min_lr_ratio) in (int, float) and not 0 <= schedule.min_lr_ratio <= 1:
        bad("train.schedule.min_lr_ratio", f"min_lr_ratio = {schedule.min_lr_ratio!r} is out of range",
            "min_lr_ratio is a fraction of the peak LR: between 0 and 1")
    count("train.schedule.decay", schedule.decay, low=0)
    member("train.schedule.shape", schedule.shape, DecayShape)
    data = train.data
    member("train.data", data.kind, DataKind)
    if type(data.dtype) is not str or data.dtype not in TOKEN_DTYPES:
        bad("train.data", f"token dtype {_show(data.dtype)} is not one of {', '.join(TOKEN_DTYPES)}")
    if data.kind is DataKind.TOKENS or data.path is not None:
        paths = data.path if type(data.path) is tuple else (data.path,)
        for path in paths:
            if type(path) is not str or not path:
                bad("train.data", "tokens(...) needs a file path")
            elif CONTROL.search(path):
                bad(
                    "train.data",
                    f"token file path {path!r} contains a control character",
                    "rename the file",
                )
    for path in data.val_path if type(data.val_path) is tuple else (data.val_path,):
        if path is not None and (type(path) is not str or not path or CONTROL.search(path)):
            bad("train.data", f"validation file path {_show(path)} is empty or holds a control character")
    if type(data.weights) is not tuple or any(type(w) is not float or not w > 0 for w in data.weights):
        bad("train.data", f"blend weights {_show(data.weights)} are not positive numbers")
    count("train.eval", train.eval_every, low=0)
    count("train.eval", train.eval_batches, low=0)
    check(problems)
    # The rules parc check applies, on the written values (auto ones are unknown to them):
    # a written zero = 3 is PAR0802 here, before the planner could call it "no layout fits".
    check(rule_errors(spec))
    return draft


def _show(value) -> str:
    """A value for a message: ``repr`` of plain literals, the type name otherwise."""
    if type(value) in (str, int, float, bool) or value is None:
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a {type(value).__name__}"
