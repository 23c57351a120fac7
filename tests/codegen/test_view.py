"""train.py's view model (codegen/view.py): a call prints as one statement under its comments,
a feature's variant is an argument it gives the call, and a section's items keep ``ORDER``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import pytest

from parc.codegen import view
import black

from parc.codegen.view import Arg, Call


def test_a_call_prints_its_comments_then_one_statement():
    call = Call(target="grad_sync", callee="dp.GradientBuckets", args=("net", "dp_group"),
                kwargs=(("overlap", "True"),), comments=("all-reduced over dp", ""), note="while backward runs")
    assert call.lines() == [
        "# all-reduced over dp",
        "#",
        "grad_sync = dp.GradientBuckets(net, dp_group, overlap=True)  # while backward runs",
    ]
    assert Call(callee="optimizer.step").lines() == ["optimizer.step()"]


def test_a_variant_is_an_argument_given_to_the_call_not_an_edit_of_its_text():
    call = Call(target="optimizer", callee="zero.ShardedAdamW", args=("net",), kwargs=(("stage", "ZERO"),))
    given = call.given(("reduce_dtype", "torch.bfloat16"), comment="summed in bf16")
    assert given.lines() == ["# summed in bf16", "optimizer = zero.ShardedAdamW(net, stage=ZERO, reduce_dtype=torch.bfloat16)"]
    assert call.kwargs == (("stage", "ZERO"),)  # frozen: the original is unchanged
    items = ["# the optimizer", call]
    assert view.with_last(items, view.last_call(items).given(("grad_sync", "grad_sync")))[-1].kwargs[-1] == (
        "grad_sync", "grad_sync")
    with pytest.raises(TypeError, match="internal error in parc"):
        view.last_call(["optimizer.step()"])


def test_an_exploded_call_prints_one_argument_a_line_as_black_keeps_it():
    codec = Call(callee="compress_pp.LowRankBackprop", exploded=True, args=("(B, T, H)",), kwargs=(("rank", "R"),))
    call = Call(target="runner", callee="pipeline.PipelineExecutor", exploded=True, args=("net",),
                kwargs=(("actions", "actions"), Arg(key="loss_fn", value="loss_fn", note="on the last stage")),
                comments=("the executor",), note="this rank's")
    given = call.given(Arg(key="grad_codec", value=codec, comments=("compressed",)))
    lines = given.lines()
    assert lines == [
        "# the executor",
        "runner = pipeline.PipelineExecutor(",
        "    net,",
        "    actions=actions,",
        "    loss_fn=loss_fn,  # on the last stage",
        "    # compressed",
        "    grad_codec=compress_pp.LowRankBackprop(",
        "        (B, T, H),",
        "        rank=R,",
        "    ),",
        ")  # this rank's",
    ]
    with pytest.raises(TypeError, match="internal error in parc"):  # the Arg holds an argument's comments
        call.given(Arg(key="grad_codec", value=replace(codec, note="lost"))).lines()
    text = "\n".join(lines) + "\n"
    assert black.format_str(text, mode=black.Mode()) == text  # black's own form: its magic trailing commas


def test_a_call_on_one_line_is_split_by_black_and_refuses_argument_comments():
    call = Call(target="actions", callee="schedule.build_schedule", args=("SCHEDULE",),
                kwargs=(("stages", "PP"), ("chunks", "CHUNKS")), index='grid.index("pp")')
    assert call.lines() == ['actions = schedule.build_schedule(SCHEDULE, stages=PP, chunks=CHUNKS)[grid.index("pp")]']
    nested = Call(callee="f", kwargs=(("codec", Call(callee="g", args=("x",))),))
    assert nested.lines() == ["f(codec=g(x))"]
    with pytest.raises(TypeError, match="internal error in parc"):
        Call(callee="f", kwargs=(Arg(key="x", value="1", note="why"),)).lines()


def test_lines_split_every_item_into_lines():
    assert view.lines(["a\nb", Call(callee="f", exploded=True, args=("x",))]) == ["a", "b", "f(", "    x,", ")"]


@dataclass(frozen=True)
class _Entry:
    name: str
    adds: Callable


def test_a_section_keeps_its_order_whatever_the_entries_order():
    def entry(name):
        return _Entry(name, lambda plan: {"loss": [f"{name} line"]})
    entries = [entry("experts"), entry("somebody new"), entry("pipeline")]
    assert view.gathered(entries, None, "loss", own=["step_loss = loss_sum"]) == [
        "pipeline line", "step_loss = loss_sum", "experts line", "somebody new line"]
    # a section without an ORDER: the renderer's own items first, then the entries' in their order
    assert view.gathered(entries, None, "eval", own=["own"]) == ["own"]
    assert set(view.ORDER) <= set(view.NAMES)
