"""A hand-written parser of ``dsl/grammar.lark`` for the common case: the fast path.

Takes: a unified text (as ``dsl/parse.py`` prepares it for lark) and an
``AstBuilder``. Gives: ``quick_parse``, the items of the Document, or None where
the text is not plainly well formed; ``dsl/parse.py`` then runs lark, whose answer
(a Document, or the syntax error) is the reference. Before: ``dsl/parse.py``.
After: ``AstBuilder.document`` (``dsl/tree.py``).

Note [quick parse]: lark's LALR parser costs about 100 us an entry (its lexer, the
parse tree, ``propagate_positions``, the walk over the tree): a file of 100k entries
took 10.8 s to parse on the benchmark machine. This parser reads the same language
in 1.3 s:

* Its words are lark's own terminals (``parser().terminals``, in the order lark's
  lexer tries them), joined into one regex, so a word is what lark reads.
  Lark's lexer is contextual: where a key is expected it does not try QUANTITY, and
  ``16 GB {`` is the block ``16`` named ``GB``. Here a QUANTITY where a key belongs
  gives up instead, so both lexers agree on every text this parser accepts.
* Newlines inside (), [] are dropped, comments recorded and brackets counted as
  the post-lexer does (``dsl/grammar.py``); past ``MAX_NESTING`` it gives up.
* The nodes, spans and non-syntax errors come from the same ``AstBuilder`` that
  lark's tree feeds, so they are the same by construction.
* Anything else it does not expect (a character no terminal matches, a token out
  of place) makes it give up: no syntax error is ever worded here.

``tests/dsl/test_quick_parse.py`` checks, on every example and on fuzzed texts, that
this parser either gives up or returns exactly what lark's path returns (nodes,
spans, comments and errors).
"""

from __future__ import annotations

import functools
import re

from dataclasses import replace

from .diagnostics import DUPLICATES_SHOWN
from .grammar import parser, record_comments
from .source import MAX_NESTING
from .tree import AstBuilder


class _GiveUp(Exception):
    """The text is not one this parser reads; lark's path will."""


@functools.lru_cache(maxsize=1)
def _regexes() -> tuple[re.Pattern, re.Pattern]:
    """The word regex and lark's ``_NL`` alone. The word regex: blanks (lark's one
    ``%ignore`` terminal, greedy: one match takes them all), then one of lark's
    terminals as a named group, tried in the order lark's lexer tries them (highest
    priority first); else ``_BAD`` (any other character) or ``_END``, so that it
    never backtracks into a run of blanks. ``_NL`` there only looks at its first
    character (``\\n`` or ``#``, as lark's ``_NL`` begins), and the lexer then matches
    lark's ``_NL`` on its own: inside a pattern of many groups, Python's re saves
    them all at each repetition of ``_NL``, three times slower on a million comments."""
    lark, _ = parser()
    (ignored,) = [t.pattern.to_regexp() for t in lark.terminals if t.name in lark.ignore_tokens]
    terminals = [t for t in lark.terminals if t.name not in lark.ignore_tokens]
    terminals.sort(key=lambda t: (-t.priority, -t.pattern.max_width, -len(t.pattern.value), t.name))
    (newline,) = [t.pattern.to_regexp() for t in terminals if t.name == "_NL"]
    starts_newline = "(?=[#\\n])"
    words = "".join(
        f"(?P<{t.name}>{starts_newline if t.name == '_NL' else t.pattern.to_regexp()})|"
        for t in terminals
    )
    word = re.compile(f"(?:{ignored})?(?:{words}(?P<_BAD>(?s:.))|(?P<_END>\\Z))")
    return word, re.compile(newline)


_UNCACHED = re.compile(r"[#\"'()\[\]]")
"""A line holding any of these is lexed each time (comments, strings, nesting)."""
LINES_CACHED = 1024


def _line_words(match_word, text: str, position: int, end: int) -> tuple | None:
    """Note [lexed lines]: the words of ``text[position:end]`` as (terminal, text, offset),
    if they end at the newline ``end``; else None (lexed as usual)."""
    words = []
    while True:
        match = match_word(text, position)
        kind = match.lastgroup
        if kind == "_NL":
            return tuple(words) if match.start(kind) == end else None
        if kind == "_BAD" or kind == "_END":
            return None
        words.append((kind, match.group(kind), match.start(kind)))
        position = match.end()


def _lex(text: str, comments: list | None) -> list[tuple[str, str, int, int]]:
    """``(terminal, text, line, column)`` of every token the parser sees.

    Note [lexed lines]: a file of many equal lines (a key set 800,000 times, a generated
    list of blocks) lexes each distinct line once: at the start of a line (depth 0, after
    a newline took its indent) the line up to its newline is looked up in ``lines``, its
    words reused at this line and column. Only lines without comments, strings or
    brackets are kept (their words cannot reach past the newline), at most LINES_CACHED."""
    word_regex, newline_regex = _regexes()
    match_word, match_newline = word_regex.match, newline_regex.match
    tokens: list[tuple[str, str, int, int]] = []
    append = tokens.append
    lines: dict[str, tuple] = {}
    line, line_start, depth, position = 1, 0, 0, 0
    while True:
        match = match_word(text, position)
        kind = match.lastgroup
        if kind == "_BAD":
            raise _GiveUp  # a character no terminal matches here
        if kind == "_END":
            break
        start = match.start(kind)
        if kind == "_NL":
            newline = match_newline(text, start)
            if newline is None:  # pragma: no cover - _NL matches at any \n or #
                raise _GiveUp
            word = newline.group()
            position = newline.end()
            if comments is not None:
                record_comments(word, line, start - line_start + 1, comments)
            if depth == 0:
                append((kind, word, line, start - line_start + 1))
            newlines = word.count("\n")
            if newlines:
                line += newlines
                line_start = start + word.rfind("\n") + 1
                end = text.find("\n", position)
                if depth == 0 and end > position:  # Note [lexed lines]
                    body = text[position:end]
                    words = lines.get(body)
                    if words is None and len(lines) < LINES_CACHED and not _UNCACHED.search(body):
                        words = _line_words(match_word, text, position, end)
                        if words is not None:
                            lines[body] = words = tuple((k, w, offset - position) for k, w, offset in words)
                    if words is not None:
                        column = position - line_start + 1
                        for kind, word, offset in words:
                            append((kind, word, line, column + offset))
                        position = end
            continue
        position = match.end()
        append((kind, match.group(kind), line, start - line_start + 1))
        if kind == "LPAR" or kind == "LSQB":
            if depth >= MAX_NESTING:
                raise _GiveUp  # lark's path reports PAR0010
            depth += 1
        elif (kind == "RPAR" or kind == "RSQB") and depth:
            depth -= 1
    append(("$END", "", line, position - line_start + 1))
    return tokens


def quick_parse(text: str, build: AstBuilder, keep_comments: bool) -> tuple | None:
    """The items of ``text`` built by ``build`` (its comments in ``build.comments``
    when ``keep_comments``), or None if lark's path must read it (Note [quick parse])."""
    comments: list | None = [] if keep_comments else None
    try:
        items = _Parser(_lex(text, comments), build, count_duplicates=not keep_comments).document()
    except _GiveUp:
        return None
    build.comments = comments or []
    return items


class _Nothing:
    """A builder that builds nothing: the parser reads a value's grammar without its AST."""

    def __getattr__(self, name):
        return _nothing


def _nothing(*args, **kwargs):
    return None


BUILT_DUPLICATES = DUPLICATES_SHOWN + 1
"""Duplicates of a key built one by one (shown, and the first counted one's position)."""


class _Parser:
    """Recursive descent over the tokens; each method reads one rule of the grammar.

    Note [duplicates counted]: a block that sets one key 800,000 times (a 10 MB file) is
    one mistake; normalize.py shows its first DUPLICATES_SHOWN duplicates and counts the
    rest in one error. When the parse only checks (``count_duplicates``: not for ``parc
    fmt``, which writes every line back), the duplicates past the first BUILT_DUPLICATES
    are read against the grammar (a syntax error in one still sends the text to lark's
    path) but not built: the block ends with one entry for the last of them, whose
    ``repeated`` counts those in between. A mistake inside a value that only building
    finds (a malformed number) is then reported on the next run, once the duplicates are
    gone.
    """

    def __init__(self, tokens: list, build: AstBuilder, count_duplicates: bool = False):
        self.tokens = tokens
        self.at = 0
        self.build = build
        self.count_duplicates = count_duplicates

    def _take(self, kind: str) -> tuple[str, str, int, int]:
        token = self.tokens[self.at]
        if token[0] != kind:
            raise _GiveUp
        self.at += 1
        return token

    def _skip_newline(self) -> None:
        if self.tokens[self.at][0] == "_NL":
            self.at += 1

    def document(self) -> tuple:
        """``start: _NL? (item (_NL item)*)? _NL?``"""
        items = []
        self._skip_newline()
        while self.tokens[self.at][0] != "$END":
            items.append(self.item())
            if self.tokens[self.at][0] != "$END":
                self._take("_NL")
        return tuple(items)

    def item(self):
        """``ATOM ATOM? "{" body "}"`` or ``ATOM "=" value``."""
        _, kind, line, column = self._take("ATOM")
        following = self.tokens[self.at]
        if following[0] == "EQUAL":
            self.at += 1
            return self.build.block_assign(kind, line, column, self.value())
        label = None
        if following[0] == "ATOM":
            self.at += 1
            label = following[1:]
        self._take("LBRACE")
        entries = self.body()
        _, _, end_line, end_column = self._take("RBRACE")
        return self.build.block(kind, line, column, label, entries, end_line, end_column + 1)

    def body(self) -> tuple:
        """``_NL? (entry (_NL entry)*)? _NL?``, up to the ``}``."""
        tokens, entry, entries = self.tokens, self.build.entry, []
        seen: dict[str, int] = {}
        latest: dict[str, tuple] = {}  # Note [duplicates counted]: key -> (line, column, value's token, count)
        self._skip_newline()
        while tokens[self.at][0] != "RBRACE":
            _, key, line, column = self._take("ATOM")
            self._take("EQUAL")
            times = seen[key] = seen.get(key, 0) + 1
            if self.count_duplicates and times > 1 + BUILT_DUPLICATES:
                start, build = self.at, self.build
                self.build = _Nothing()
                try:
                    self.value()
                finally:
                    self.build = build
                latest[key] = (line, column, start, times - 1 - BUILT_DUPLICATES)
            else:
                entries.append(entry(key, line, column, self.value()))
            if tokens[self.at][0] != "RBRACE":
                self._take("_NL")
        for key, (line, column, start, counted) in latest.items():
            end, self.at = self.at, start
            entries.append(replace(entry(key, line, column, self.value()), repeated=counted - 1))
            self.at = end
        return tuple(entries)

    def value(self):
        kind, text, line, column = self.tokens[self.at]
        self.at += 1
        if kind == "ATOM":
            if self.tokens[self.at][0] == "LPAR":
                self.at += 1
                return self.call(text, line, column)
            return self.build.atom(text, line, column)
        if kind == "QUANTITY":
            return self.build.quantity(text, line, column)
        if kind == "STRING":
            return self.build.string(text, line, column)
        if kind == "LSQB":
            items, end = self.elements("RSQB")
            return self.build.list_value(items, self.build.span(line, column, *end))
        if kind == "LPAR":
            items, end = self.elements("RPAR")
            return self.build.tuple_value(items, self.build.span(line, column, *end))
        raise _GiveUp

    def elements(self, closer: str) -> tuple[tuple, tuple[int, int]]:
        """``[value ("," value)* ","?]`` and the closer; the items and where the closer ends."""
        items = []
        while self.tokens[self.at][0] != closer:
            items.append(self.value())
            if self.tokens[self.at][0] != closer:
                self._take("COMMA")
        _, _, line, column = self._take(closer)
        return tuple(items), (line, column + 1)

    def call(self, name: str, line: int, column: int):
        """``ATOM "(" [arguments] ")"``, after the ``(``; an argument is a value or
        ``ATOM "=" value``."""
        arguments = []
        tokens = self.tokens
        while tokens[self.at][0] != "RPAR":
            kind, text, name_line, name_column = tokens[self.at]
            if kind == "ATOM" and tokens[self.at + 1][0] == "EQUAL":
                self.at += 2
                arguments.append(self.build.keyword(text, name_line, name_column, self.value()))
            else:
                arguments.append(self.build.positional(self.value()))
            if tokens[self.at][0] != "RPAR":
                self._take("COMMA")
        _, _, end_line, end_column = self._take("RPAR")
        return self.build.call(name, line, column, tuple(arguments), end_line, end_column + 1)
