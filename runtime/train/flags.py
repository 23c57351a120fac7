"""The trainer's command-line values, checked as argparse reads them.

Takes: the text of one flag's value. Gives: ``type=`` callables for ``argparse``:
``whole(low, high)`` (an integer in [low, high]), ``path`` (a non-empty name without
control characters) and ``step_range`` (``--profile``'s ``N`` or ``A-B``). A value out of
its range is argparse's usage error, before anything starts: ``train.py: error: argument
--steps: must be at least 1, got -3`` (exit 2), not a run that does nothing and exits 0
(``--steps -3``) or a silent other meaning (``--checkpoint-every -2`` read as 0). Every
flag of a generated ``train.py`` has one (codegen/render_flags.py writes them).
Before: the shell. After: ``parse_args``.
"""

from __future__ import annotations

import argparse

INT_MAX = 2**31 - 1
"""The largest count a flag takes, as the spec's integers (dsl/keys/ ``INT_MAX``)."""


def whole(low: int, high: int = INT_MAX):
    """An integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def path(text: str) -> str:
    """A file or folder name: not empty, no control characters."""
    if not text:
        raise argparse.ArgumentTypeError("expects a path, got an empty string")
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"{text!r} holds the control character U+{ord(bad):04X}")
    return text


def steps_of(text: str) -> tuple[int, int]:
    """``--profile STEPS``: ``N`` (one step) or ``A-B`` (steps A to B, both included);
    ``ValueError`` with the message otherwise."""
    first, dash, last = text.partition("-")
    try:
        a, b = int(first), int(last if dash else first)
    except ValueError:
        raise ValueError(f"{text!r}: expected a step N or a range A-B such as 3-5") from None
    if a < 1 or b < a:
        raise ValueError(f"{text!r}: steps are counted from 1 and A-B needs A <= B")
    return a, b


def step_range(text: str) -> str:
    """``--profile``'s type: the text, once ``steps_of`` reads it."""
    try:
        steps_of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
