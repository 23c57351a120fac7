"""train.py's view model: sections of calls and lines, which the features fill.

Takes: what ``render.py`` and the features' entries (``features.Feature.adds``) put in
each section. Gives: ``Call`` (one statement that calls something: its comment lines, the
name it binds, the callee, its positional and keyword arguments in order, a trailing
comment; on one line or exploded, Note [exploded calls]), ``Arg`` (an argument with its
comments), ``lines(items)`` (their text, one line each; a string item is statements as
they are: a comment, a loop, an ``if`` or ``with`` block, a dict's entry), ``NAMES`` (the
sections) and ``gathered(features, plan, section, own)`` (a section: the renderer's own
items and those the features in use add, in the section's ``ORDER``).
Before: the features' render hooks. After: ``templates/train.py.j2``'s one macro, black.

Note [a section is a list of calls]: a feature changes a call by giving it an argument
(``Call.given``: ``reduce_dtype=torch.bfloat16`` for ``train.grad_reduce = bf16``, the
``grad_sync`` of a compressed reduction, the per-layer ``layouts``), never by editing
text already rendered; and it adds its own statements to a named section through its
entry's ``adds`` hook, so the renderer loops over the entries instead of naming them.
A section's items keep the order ``ORDER`` gives the features that add to it (the order
train.py has always had: groups are made in the same order on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

NAMES = ("flag_docs", "std_imports", "runtime_imports", "config", "tp_plan", "flags", "groups", "model_config", "model",
         "data", "optimizer", "optimizer_extra", "pipeline", "checkpoint", "eval_only", "lr", "step_body",
         "after_backward", "step", "loss", "eval", "record", "memory_record", "end_of_step", "after_loop")
"""train.py's sections, in the order the template places them."""

ORDER = {
    "groups": ("2D tensor parallel", "context parallel", "data parallel", "pipeline", "experts",
               "per-layer tp × dp"),
    "after_backward": ("train.py", "data parallel", "pipeline", "sequence parallel", "experts"),
    "pipeline": ("pipeline", "evaluation"),
    "loss": ("pipeline", "train.py", "experts"),
    "optimizer_extra": ("data parallel", "fp16 loss scaling", "experts", "train.py"),
    "record": ("evaluation", "experts", "train.py", "fp16 loss scaling"),
}
"""The order within a section of the features that add to it, ``train.py`` standing for the
renderer's own items (first where not named); features not named come last, in ``FEATURES``'s order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arg:
    """An argument on its own line of an exploded call: ``key=value,  # note`` under its
    comment lines (no ``key``: a positional argument); the value may be a call itself (its
    comments and note are the ``Arg``'s: the call's own would be lost, and are refused)."""

    value: Union[str, Call]
    key: str = ""
    comments: tuple[str, ...] = ()
    note: str = ""
    """The comment at the end of the argument's line (of its last line, a call's ``)``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """``target = callee(args..., key=value...)[index]  # note``, under its comment lines.

    Note [exploded calls]: black keeps a call whose last argument ends in a comma (its
    "magic trailing comma") one argument a line, and any other call it lays out itself from
    the joined text. So a call is written on one line, for black to split where it is too
    long, or ``exploded``: one argument a line, each with its comma, where an argument
    carries a comment (``Arg``) or the call reads best so (the executor, the evaluator, the
    checkpoints); either way the output is black's, and a feature adds an argument the
    same way (``given``)."""

    callee: str
    args: tuple[Union[str, Arg], ...] = ()
    kwargs: tuple[Union[tuple[str, str], Arg], ...] = ()
    """Keyword arguments in order: (keyword, the expression it takes), or an ``Arg`` with comments."""
    target: str = ""
    comments: tuple[str, ...] = ()
    """The comment lines above the call, without their ``# ``."""
    note: str = ""
    """The comment at the end of the call's line (exploded: of its closing parenthesis)."""
    exploded: bool = False
    index: str = ""
    """What the call's result is indexed by: ``[index]`` after it."""

    def given(self, *kwargs: Union[tuple[str, str], Arg], comment: str = "") -> Call:
        """The call with more keyword arguments (at its end), and ``comment`` as the last
        comment line above it: a feature's variant of the call (Note [a section is a list of calls])."""
        comments = self.comments + ((comment,) if comment else ())
        return replace(self, kwargs=self.kwargs + kwargs, comments=comments)

    def arguments(self) -> list[Arg]:
        """Every argument in order, positional first, as ``Arg``s."""
        return [arg if isinstance(arg, Arg) else Arg(value=arg) for arg in self.args] + [
            arg if isinstance(arg, Arg) else Arg(key=arg[0], value=arg[1]) for arg in self.kwargs]

    def expression(self) -> str:
        """The call on one line, without its target and comments."""
        return f"{self.callee}({', '.join(_inline(arg) for arg in self.arguments())})" + self._index()

    def lines(self) -> list[str]:
        bound = f"{self.target} = " if self.target else ""
        note = f"  # {self.note}" if self.note else ""
        text = self._statement()
        text = [bound + text[0], *text[1:]]
        return _comments(self.comments) + text[:-1] + [text[-1] + note]

    def _statement(self) -> list[str]:
        if not self.exploded:
            return [self.expression()]
        out = [f"{self.callee}("]
        for arg in self.arguments():
            if isinstance(arg.value, Call) and (arg.value.target or arg.value.comments or arg.value.note):
                raise TypeError(f"internal error in parc: a call as an argument has its own comments: {arg!r}")
            value = arg.value._statement() if isinstance(arg.value, Call) else [arg.value]
            value = [(f"{arg.key}=" if arg.key else "") + value[0], *value[1:]]
            value[-1] += "," + (f"  # {arg.note}" if arg.note else "")
            out += ["    " + line for line in _comments(arg.comments) + value]
        return out + [")" + self._index()]

    def _index(self) -> str:
        return f"[{self.index}]" if self.index else ""


def _comments(lines: tuple[str, ...]) -> list[str]:
    return [f"# {line}" if line else "#" for line in lines]


def _inline(arg: Arg) -> str:
    """An argument of a call on one line (its comments need the exploded form)."""
    if arg.comments or arg.note:
        raise TypeError(f"internal error in parc: an argument with comments in a call on one line: {arg!r}")
    value = arg.value.expression() if isinstance(arg.value, Call) else arg.value
    return f"{arg.key}={value}" if arg.key else value


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The optimizer step's items: the gradients' reduction and clip, the update, the reset
    (``render_checkpoint.guarded_step`` puts the update under the guard)."""

    clip: tuple
    update: str
    clear: str = "optimizer.zero_grad()"


Item = Union[Call, str]
"""A section's item: a call, or statements as they are (a string, lines split at its newlines)."""


def constant(name: str, value, comment: str) -> str:
    """A constant of train.py's config block, its value through ``repr``, citing where it came from."""
    return f"{name} = {value!r}  # {comment}"


def lines(items) -> list[str]:
    """The items' text, one line per string (a string item may hold several lines)."""
    out = []
    for item in items:
        out += item.split("\n") if isinstance(item, str) else item.lines()
    return out


def last_call(items: list[Item]) -> Call:
    """The section's last item, the call a feature gives an argument to."""
    call = items[-1]
    if not isinstance(call, Call):
        raise TypeError(f"internal error in parc: render expected a call last, not {call!r}")
    return call


def with_last(items: list[Item], call: Call) -> list[Item]:
    """``items`` with its last call replaced by ``call``."""
    return [*items[:-1], call]


def gathered(features, plan, section: str, own=()) -> list[Item]:
    """The section: the renderer's ``own`` items and what the features in ``features`` (those in
    use) add to it, in its ``ORDER``."""
    order = ORDER.get(section, ())
    rank = {name: at for at, name in enumerate(order)}
    parts = [(rank.get("train.py", -1), list(own))]
    parts += [(rank.get(feature.name, len(order)), feature.adds(plan).get(section, [])) for feature in features]
    return [item for _, items in sorted(parts, key=lambda part: part[0]) for item in items]
