"""The lark parser of ``dsl/grammar.lark`` and its post-lexer.

Takes: nothing but the grammar file. Gives: ``parser()`` (the LALR parser, built
once, and its post-lexer), ``TooDeep`` (raised by the post-lexer past
``MAX_NESTING``) and ``KEY_RE`` (what a key, block or function name is). The
pieces that ``dsl/parse.py`` (which runs the parser), ``dsl/syntax_errors.py``
(which reads the post-lexer's state at an error) and ``dsl/tree.py`` (which
classifies words) share live here, so none of those imports another.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from lark import Lark, Token
from lark.exceptions import LexError
from lark.lark import PostLex

from .source import MAX_NESTING

KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A key, block kind or name, function or argument name: an identifier."""
_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB"}


class TooDeep(Exception):
    """Raised by the post-lexer at an opening bracket nested past MAX_NESTING."""

    def __init__(self, token: Token):
        self.token = token


class PostLexer(PostLex):
    """Drops ``_NL`` inside brackets, records comments and the open brackets/braces.

    Its state describes the parse in progress, so ``syntax_errors`` can say which
    block or bracket was left open. A bracket is pushed after its token has been
    handed to the parser, so at an error the stacks hold what was open before the
    offending token. Comments are ``(line, column, text)``, recorded only when
    ``keep_comments`` (``dsl/parse.py`` sets it for each parse).
    """

    always_accept = ("_NL",)

    def __init__(self) -> None:
        self.keep_comments = True
        self.comments: list[tuple[int, int, str]] = []
        self.brackets: list[Token] = []
        self.braces: list[Token] = []

    def process(self, stream):
        self.comments, self.brackets, self.braces = [], [], []
        for token in stream:
            if token.type == "_NL":
                if self.keep_comments:
                    record_comments(str(token), token.line, token.column, self.comments)
                if self.brackets:
                    continue
            yield token
            if token.type in _OPENERS:
                if len(self.brackets) >= MAX_NESTING:
                    raise TooDeep(token)
                self.brackets.append(token)
            elif token.type in ("RPAR", "RSQB") and self.brackets:
                self.brackets.pop()
            elif token.type == "LBRACE":
                self.braces.append(token)
            elif token.type == "RBRACE" and self.braces:
                self.braces.pop()


def record_comments(text: str, line: int, column: int, comments: list) -> None:
    """Append to ``comments`` the ``#`` comments of a newline token ``text`` that
    starts at ``line``, ``column``. The token is blank lines and comments: its i-th
    line is line ``line + i``, and the first ``#`` on a line starts a comment (the
    text is walked once, so time is linear)."""
    if "#" not in text:
        return
    record = comments.append
    for i, piece in enumerate(text.split("\n")):
        at = piece.find("#")
        if at >= 0:
            start = column + at if i == 0 else at + 1
            record((line + i, start, piece[at:].rstrip()))


@functools.lru_cache(maxsize=1)
def parser() -> tuple[Lark, PostLexer]:
    """The LALR parser (built once). Built in strict mode when lark can check regex
    collisions (that needs the optional ``interegular``); shift/reduce conflicts are
    checked by ``tests/dsl/test_parse.py`` either way."""
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    postlex = PostLexer()
    options = dict(
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        start=["start", "override"],
        postlex=postlex,
    )
    try:
        lark = Lark(grammar, strict=True, **options)
    except LexError as exc:
        if "interegular" not in str(exc):
            raise
        lark = Lark(grammar, **options)
    return lark, postlex
