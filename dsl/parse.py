"""Text → syntax tree.

Takes: the text of a ``.par`` file (or of one ``--set`` argument) and the file name
to put in spans. Gives: a ``Document`` (``dsl/ast.py``), or raises ``Diagnostics``
(with the text in ``.sources``). Any text gives one or the other, never another
exception: lark's exceptions are translated by ``dsl/syntax_errors.py``.

Before: reading the file (``parc.dsl.read_text``). After: ``dsl/normalize.py``;
``dsl/fmt.py`` prints a Document back as text.

The grammar is ``dsl/grammar.lark``, run by the parser of ``dsl/grammar.py`` (LALR,
positions on), whose post-lexer drops newlines inside (), [] and collects comments,
which the grammar otherwise ignores; ``dsl/tree.py`` turns lark's tree into the AST,
classifying each word (number, name, key) and decoding strings. A file is first
given to the hand-written ``dsl/quick_parse.py`` (five times faster), which builds
the same AST through the same ``AstBuilder`` or gives up; lark reads what it gives
up on, and words every syntax error (Note [quick parse]). Before either, the text
is checked for characters no spec may hold and its newlines unified (Note [newlines]
in ``dsl/source.py``); one line index serves the post-lexer, the tree and the
diagnostics.
"""

from __future__ import annotations

from lark import Token
from lark.exceptions import LarkError, UnexpectedInput

from . import ast
from .diagnostics import Diagnostics, ParcError, SourceMap
from .grammar import TooDeep, parser
from .source import LineIndex, bad_character, is_surrogate, no_collection, unify_newlines
from .syntax_errors import translate
from .quick_parse import quick_parse
from .tree import AstBuilder, TreeToAst

__all__ = ["parse", "parse_override", "parser"]


def parse(text: str, file: str, *, comments: bool = True, quick: bool = True) -> ast.Document:
    """Parse ``text`` (named ``file`` in spans and messages) into a Document; with
    ``comments=False`` its ``comments`` are left empty (checking needs none, and a
    file may hold a million). ``quick=False`` skips the fast path and always runs
    lark (Note [quick parse] in ``dsl/quick_parse.py``; tests compare the two)."""
    return _run(text, file, "start", comments, quick)


def parse_override(text: str, file: str) -> tuple[Token, ast.Value]:
    """Parse one ``--set`` argument ``KEY=VALUE``: the KEY token and the value."""
    return _run(text, file, "override", False, False)


def _run(text: str, file: str, start: str, comments: bool, quick: bool):
    clean = unify_newlines(text)
    index = LineIndex(clean)
    sources = SourceMap()
    sources.add(file, text, index)
    bad = bad_character_error(clean, file, index)
    if bad:
        raise Diagnostics([bad], sources)
    # A byte-order mark reads as a blank, so columns still match the text.
    if clean.startswith("\ufeff"):
        clean = " " + clean[1:]
    builder = AstBuilder(file, index, [])
    items = None
    if quick:
        with no_collection():
            items = quick_parse(clean, builder, comments)
    if items is not None:
        result = builder.document(items)
    else:  # a fresh builder: the quick parser may have built (and found errors) before it gave up
        builder = AstBuilder(file, index, [])
        result = _lark_parse(clean, start, comments, builder, sources)
    if builder.errors:
        raise Diagnostics(builder.errors, sources)
    return result


def _lark_parse(clean: str, start: str, comments: bool, builder: AstBuilder, sources: SourceMap):
    """The reference parse: lark's, then its tree walked into the AST."""
    lark, postlex = parser()
    postlex.keep_comments = comments
    try:
        with no_collection():
            tree = lark.parse(clean, start=start)
    except (UnexpectedInput, TooDeep) as exc:
        raise Diagnostics([translate(exc, builder.lines, builder.file)], sources) from None
    except (LarkError, RecursionError) as exc:  # pragma: no cover - a bug, said as one
        raise RuntimeError(f"internal error in parc (parse): {exc!r}") from exc
    builder.comments = postlex.comments
    with no_collection():
        return TreeToAst(builder).transform(tree)


def bad_character_error(text: str, file: str, index: LineIndex) -> ParcError | None:
    """In ``text`` (unified, ``index`` its lines): a control character (other than tab, newline, form feed) or a lone surrogate,
    anywhere in the text, comments and strings included, is refused."""
    offset = bad_character(text)
    if offset is None:
        return None
    line, column = index.position(offset)
    span = ast.Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
    char = text[offset]
    if is_surrogate(char):
        return ParcError(span=span, code="PAR0001", message="the text is not valid Unicode here")
    return ParcError(
        span=span,
        code="PAR0002",
        message=f"unexpected control character U+{ord(char):04X}",
        hint="a spec holds no control characters; in a string write an escape such as \\u0000",
    )
