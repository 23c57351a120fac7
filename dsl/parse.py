"""Text → syntax tree.

Takes: the text of a ``.par`` file (or of one ``--set`` argument) and the file name
to put in spans. Gives: a ``Document`` (``dsl/ast.py``), or raises ``Diagnostics``
(with the text in ``.sources``). Any text gives one or the other, never another
exception: lark's exceptions are translated by ``dsl/syntax_errors.py``.

Before: reading the file (``dsl/load.py``). After: ``dsl/normalize.py``; ``dsl/fmt.py``
prints a Document back as text.

The grammar is ``dsl/grammar.lark`` (LALR, positions on). A post-lexer drops
newlines inside (), [] and collects comments, which the grammar otherwise ignores;
``dsl/tree.py`` turns lark's tree into the AST, classifying each word (number,
name, key) and decoding strings.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from lark import Lark, Token
from lark.exceptions import LarkError, LexError, UnexpectedInput
from lark.lark import PostLex

from . import ast
from .diagnostics import Diagnostics, ParcError, SourceMap

MAX_NESTING = 32
"""Deepest nesting of (), [] accepted; deeper input is refused before it reaches
the (recursive) tree transformer."""

KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A key, block kind or name, function or argument name: an identifier."""
_COMMENT_RE = re.compile(r"#[^\n]*")
_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB"}


class TooDeep(Exception):
    """Raised by the post-lexer at an opening bracket nested past MAX_NESTING."""

    def __init__(self, token: Token):
        self.token = token


class _PostLexer(PostLex):
    """Drops ``_NL`` inside brackets, records comments and the open brackets/braces.

    Its state describes the parse in progress, so ``syntax_errors`` can say which
    block or bracket was left open. A bracket is pushed after its token has been
    handed to the parser, so at an error the stacks hold what was open before the
    offending token.
    """

    always_accept = ("_NL",)

    def __init__(self) -> None:
        self.comments: list[Token] = []
        self.brackets: list[Token] = []
        self.braces: list[Token] = []

    def process(self, stream):
        self.comments, self.brackets, self.braces = [], [], []
        for token in stream:
            if token.type == "_NL":
                self.comments.extend(_comments_in(token))
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


def _comments_in(token: Token) -> list[Token]:
    """The ``#`` comments inside a newline token, each as a Token with its position."""
    found = []
    text = str(token)
    for match in _COMMENT_RE.finditer(text):
        start = match.start()
        newlines = text.count("\n", 0, start)
        if newlines:
            column = start - text.rfind("\n", 0, start)
        else:
            column = token.column + start
        comment = match.group().rstrip()
        found.append(
            Token(
                "COMMENT",
                comment,
                line=token.line + newlines,
                column=column,
                end_line=token.line + newlines,
                end_column=column + len(comment),
            )
        )
    return found


@functools.lru_cache(maxsize=1)
def parser() -> tuple[Lark, _PostLexer]:
    """The LALR parser (built once). Built in strict mode when lark can check regex
    collisions (that needs the optional ``interegular``); shift/reduce conflicts are
    checked by ``tests/dsl/test_parse.py`` either way."""
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    postlex = _PostLexer()
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


def parse(text: str, file: str) -> ast.Document:
    """Parse ``text`` (named ``file`` in spans and messages) into a Document."""
    return _run(text, file, "start")


def parse_override(text: str, file: str) -> tuple[Token, ast.Value]:
    """Parse one ``--set`` argument ``KEY=VALUE``: the KEY token and the value."""
    return _run(text, file, "override")


def _run(text: str, file: str, start: str):
    from .syntax_errors import translate
    from .tree import TreeToAst

    sources = SourceMap()
    sources.add(file, text)
    bad = _unencodable(text, file)
    if bad:
        raise Diagnostics([bad], sources)
    # A byte-order mark reads as a blank, so columns still match the text.
    clean = " " + text[1:] if text.startswith("\ufeff") else text
    lark, postlex = parser()
    try:
        tree = lark.parse(clean, start=start)
    except (UnexpectedInput, TooDeep) as exc:
        raise Diagnostics([translate(exc, clean, file)], sources) from None
    except (LarkError, RecursionError) as exc:  # pragma: no cover - a bug, said as one
        raise RuntimeError(f"internal error in parc (parse): {exc!r}") from exc
    builder = TreeToAst(file, clean, postlex.comments)
    result = builder.transform(tree)
    if builder.errors:
        raise Diagnostics(builder.errors, sources)
    return result


def _unencodable(text: str, file: str) -> ParcError | None:
    """Text that cannot be written out as UTF-8 (lone surrogates) is refused."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        column = exc.start - (text.rfind("\n", 0, exc.start) + 1) + 1
        span = ast.Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
        return ParcError(span=span, code="PAR0001", message="the text is not valid Unicode here")
