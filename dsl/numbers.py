"""A number as written → its value, or the one reason it is not a number parc takes.

Takes: the text of a number, from a ``.par`` word or a JSON number. Gives:
``NUMBER_RE`` (what a number looks like: ASCII digits only, ``_`` between digits,
an optional fraction and exponent) and ``read_number``. Both front ends
(``dsl/tree.py``, ``dsl/jsonspec.py``) read numbers here, so they refuse the same
texts with the same words. Ranges (what a key accepts) are not decided here but in
``dsl/keys/``; this module only refuses what no key could take: a number too
long to read, one that overflows a float, and one that underflows to 0.

Python's ``int()`` and ``float()`` accept other scripts' digits (``int("٤٠") ==
40``); ``NUMBER_RE`` is matched first, so they never see one.
"""

from __future__ import annotations

import math
import re

NUMBER_RE = re.compile(r"[+-]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9][0-9_]*)([eE][+-]?[0-9]+)?")
MAX_DIGITS = 100
"""A number with more digits is refused before conversion (every integer key is
below 2**32; Python refuses to convert integers of over 4300 digits)."""


class NumberError(ValueError):
    """Why a number text is refused: ``message`` and ``hint`` for a diagnostic."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


def read_number(text: str, shown: str) -> int | float:
    """The value of ``text`` (an int unless it has a fraction or an exponent);
    ``shown`` is how messages quote it. Raises ``NumberError``."""
    if len(text) <= MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)  # the common case (`layers = 96`), decided at once: same value
    if not NUMBER_RE.fullmatch(text):
        raise NumberError(f"malformed number {shown}", "numbers look like 4, 1_000, 0.9 or 3e-4")
    if sum(c.isdigit() for c in text) > MAX_DIGITS:
        raise NumberError(
            f"number {shown} is too long", f"a number has at most {MAX_DIGITS} digits"
        )
    try:
        if any(c in text for c in ".eE"):
            value: int | float = float(text)
        else:
            value = int(text, 10)
    except ValueError:
        raise NumberError(f"malformed number {shown}", "`_` goes between digits: 1_000") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"number {shown} is too large", "the largest number is about 1.8e308")
    if value == 0 and any(c in "123456789" for c in _mantissa(text)):
        raise NumberError(
            f"number {shown} is too small: it rounds to 0",
            "the smallest number is about 2.2e-308; write 0 for zero",
        )
    return value


def _mantissa(text: str) -> str:
    return re.split("[eE]", text, maxsplit=1)[0]
