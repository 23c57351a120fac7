"""Lark's exceptions → one ``ParcError`` a person can act on.

Takes: the exception lark raised while parsing, the text and file name. Gives: a
``ParcError`` with a PAR00xx code, a message that names the mistake, and a hint.
Lark's own exception text is never shown.

Common mistakes are recognised with lark's ``match_examples``: each label below has
small broken inputs, and the parser state at the error is matched against theirs.
The post-lexer's record of open blocks and brackets then says *which* block or
bracket was left open. Before: ``dsl/parse.py`` (which calls ``translate``).
"""

from __future__ import annotations

import functools
import unicodedata

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from .ast import span_between
from .diagnostics import ParcError, Span, clip
from .grammar import TooDeep, parser
from .source import MAX_NESTING, LineIndex

# label → broken inputs that show it. Checked in order; see test_syntax_errors.py.
EXAMPLES: dict[str, list[str]] = {
    "missing-value": [
        "model m {\n  layers =\n}\n",
        "model m {\n  layers = }\n",
        "model m {\n  layers =",
        "parallel =\n",
        "model m {\n  a = f(x = )\n}\n",
        "model m {\n  a = f(x =\n",
    ],
    "stray-comma": [
        "model m {\n  layers = 4,\n}\n",
        "model m {\n  a = 1, b = 2\n}\n",
        "model m {\n  a = (1,,2)\n}\n",
        "model m {\n  a = [,]\n}\n",
        "model m {\n  a = (,)\n}\n",
        "model m {\n  a = f(,)\n}\n",
        "model m {\n  a = f(x = 1,,)\n}\n",
        "model m {,\n}\n",
        "model m {\n  a = 1\n},\n",
        "model m, {\n}\n",
        "parallel = auto,\n",
    ],
    "missing-equals": [
        "model m {\n  layers 4\n}\n",
        "model m {\n  layers\n}\n",
        "model m {\n  layers }\n",
        "model m {\n  a = f(x 1)\n}\n",
        'model m {\n  layers "x"\n}\n',
        "model m {\n  layers [1]\n}\n",
        "model m {\n  layers 4 GB\n}\n",
    ],
    "one-per-line": [
        "model m {\n  a = 1 b = 2\n}\n",
        'model m {\n  a = 1 "b"\n}\n',
        'model m {\n  a = "x" b\n}\n',
        "model m {\n  a = f() b\n}\n",
        "model m {\n  a = 1 2\n}\n",
        "model m {\n  a = 1 {\n}\n",
        "parallel = auto mesh {\n}\n",
        "model m {\n  a = 1\n} mesh {\n}\n",
    ],
    "missing-open-brace": [
        "model m\n  layers = 4\n}\n",
        "model m layers = 4\n}\n",
        "mesh\n",
        "mesh",
        "model m }\n",
    ],
    "missing-close-brace": [
        "model m {\n  layers = 4\n",
        "model m {\n  layers = 4",
        "model m {\n",
        "model m {\n  layers = 4\n\nmesh {\n",
        "model m {\n  layers = 4\nmesh {\n",
        "model m {\n  a = 1\n  mesh = 2\n  b c {\n",
    ],
    # A value followed by a word on a later line inside brackets is also an unclosed
    # bracket; that parser state is shared with "one-per-line", see translate().
    "unclosed-bracket": [
        "model m {\n  a = (1\n",
        "model m {\n  a = f(1\n}",
        "model m {\n  a = [1 }",
        "model m {\n  a = (1 ]",
        "model m {\n  a = [1 )",
    ],
    "unmatched-close": [
        "}\n",
        "model m {\n}\n}\n",
        "model m {\n  a = 1)\n}\n",
        "model m {\n  a = 1]\n}\n",
        "model m {\n  a = )\n}\n",
        "model m {\n  a = ]\n}\n",
        ")\n",
    ],
}

MESSAGES = {
    "missing-value": (
        "PAR0008",
        "missing value after `=`",
        "write a value: a number, a name, a string, [..] or a call",
    ),
    "stray-comma": ("PAR0007", "stray `,`", None),
    "missing-equals": ("PAR0006", "missing `=`", None),
    "one-per-line": (
        "PAR0009",
        "expected the end of the line",
        "each entry goes on its own line: `key = value`",
    ),
    "missing-open-brace": ("PAR0005", "missing `{`", None),
    "missing-close-brace": ("PAR0005", "missing `}`", None),
    "unclosed-bracket": ("PAR0010", "unclosed bracket", None),
    "unmatched-close": ("PAR0010", "unmatched closing bracket", None),
}

_PUNCTUATION = {
    "LBRACE": "{",
    "RBRACE": "}",
    "LPAR": "(",
    "RPAR": ")",
    "LSQB": "[",
    "RSQB": "]",
    "COMMA": ",",
    "EQUAL": "=",
}
_CLOSER = {"(": ")", "[": "]"}
_HINT_FOR_CHAR = {
    "'": 'strings use double quotes: "data/x.bin"',
    ":": "entries are `key = value`",
    ";": "entries end at the end of the line; no `;` needed",
    "/": 'write a path as a string: "data/x.bin"',
    "*": "values are literals: write the product out",
}


def translate(exc: Exception, lines: LineIndex, file: str) -> ParcError:
    """The diagnostic for ``exc``, raised by lark (or the post-lexer) on the text
    whose ``lines`` are given."""
    lark, postlex = parser()
    braces, brackets = list(postlex.braces), list(postlex.brackets)
    if isinstance(exc, TooDeep):
        return ParcError(
            span=span_between(file, exc.token),
            code="PAR0010",
            message="brackets nested too deeply",
            hint=f"values nest at most {MAX_NESTING} levels",
        )
    if isinstance(exc, UnexpectedCharacters):
        return _unexpected_character(exc, lines, file)
    if not isinstance(exc, UnexpectedInput):  # pragma: no cover - parse.py passes only these
        raise TypeError(f"internal error in parc (syntax errors): {exc!r}")
    token = getattr(exc, "token", None)
    if token is None:  # pragma: no cover - LALR reports the end as a $END token
        token = Token("$END", "", line=len(lines.lines), column=1)
    label = match_example(exc)
    span = _token_span(token, lines, file)
    where = _describe(token)
    expected_terminals = _expected_terminals(exc)
    label = label or _fallback_label(token, expected_terminals, brackets, braces)
    if label is None:
        expected = _expected_words(expected_terminals - ({"_NL"} if brackets else set()))
        return ParcError(
            span=span,
            code="PAR0004",
            message=f"unexpected {_bare(where)}" + (f"; expected {expected}" if expected else ""),
        )
    if label == "one-per-line" and brackets:
        if token.line > brackets[-1].line or token.type == "RBRACE":
            label = "unclosed-bracket"
        else:
            closer = _CLOSER.get(str(brackets[-1]), ")")
            return ParcError(
                span=span,
                code="PAR0004",
                message=f"unexpected {where}; expected `,` or `{closer}`",
                hint="separate values with `,`",
            )
    code, message, hint = MESSAGES[label]
    if label == "missing-close-brace" and braces:
        opener = braces[-1]
        kind = _first_word(lines, opener.line)
        message = f"missing `}}`: the {kind}block opened on line {opener.line} is not closed"
        hint = "add `}` after the block's last entry"
        if token.type != "$END":
            start_token = _line_start_token(exc, token)
            message += f" before {_describe(start_token)}"
            span = _token_span(start_token, lines, file)
        return ParcError(span=span, code=code, message=message, hint=hint)
    if label == "unclosed-bracket" and brackets:
        opener = brackets[-1]
        closer = _CLOSER.get(str(opener), ")")
        message = f"`{opener}` is not closed: expected `{closer}` before {where}"
        return ParcError(
            span=span_between(file, opener),
            code=code,
            message=message,
            hint=f"add `{closer}`; a value may span lines only inside brackets",
        )
    if label == "stray-comma":
        hint = (
            "remove the extra `,`" if brackets else "entries are separated by new lines, not commas"
        )
    elif label == "missing-equals":
        previous = _previous(exc)
        message = f"missing `=` after `{previous}`" if previous is not None else message
        hint = (
            f"write `{previous} = value`" if previous is not None else "entries are `key = value`"
        )
    elif label == "missing-open-brace":
        message = f"missing `{{` before {where}"
        hint = "a block is `kind name {`, entries on the lines below, then `}`"
    elif label == "one-per-line":
        message = f"expected the end of the line before {where}"
    elif label == "unmatched-close":
        message = f"unmatched `{token}`"
        hint = "nothing is open here for it to close"
    return ParcError(span=span, code=code, message=message, hint=hint)


def _expected_terminals(exc: UnexpectedInput) -> set[str]:
    """The tokens that could have come next. An error raised by the contextual lexer
    lists what the lexer allowed, and an LALR state lists every lookahead it reduces
    on; lark's interactive parser tries each token and keeps those that advance."""
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except Exception:  # noqa: BLE001 - only a better message is lost
            pass
    return set(getattr(exc, "expected", None) or ())


def _fallback_label(token: Token, expected: set, brackets: list, braces: list) -> str | None:
    """A label from the token and what is open, where no example matched the state."""
    if token.type == "$END" and (brackets or braces):
        return "unclosed-bracket" if brackets else "missing-close-brace"
    if token.type == "COMMA":
        return "stray-comma"
    if token.type in ("RPAR", "RSQB") and not brackets or token.type == "RBRACE" and not braces:
        return "unmatched-close"
    if "STRING" in expected and token.type in ("$END", "_NL", "RBRACE", "RPAR", "RSQB"):
        return "missing-value"  # e.g. `--set parallel.dp=`
    return None


def _state_of(exc: UnexpectedInput):
    """The LALR state at an error: an int, or a ParserState when the contextual lexer
    raised the error (then its ``position``)."""
    state = exc.state
    return getattr(state, "position", state)


@functools.lru_cache(maxsize=1)
def _example_table() -> tuple[tuple[str, object, str, str], ...]:
    """(label, parser state, token type, token text) of each example's error."""
    lark, _ = parser()
    rows = []
    for label, examples in EXAMPLES.items():
        for example in examples:
            try:
                lark.parse(example, start="start")
            except UnexpectedToken as exc:
                rows.append((label, _state_of(exc), exc.token.type, str(exc.token)))
    return tuple(rows)


def match_example(exc: UnexpectedInput) -> str | None:
    """The label of the example whose error is most like ``exc``: same parser state
    and token, else same state and token type, else same state.

    This is lark's ``UnexpectedInput.match_examples`` with the examples' states
    computed once; lark 1.3.1's own crashes on errors raised by the contextual
    lexer (it formats a ParserState with ``%d``).
    """
    token = getattr(exc, "token", None)
    if token is None or exc.state is None:
        return None
    state = _state_of(exc)
    best: tuple[int, str] | None = None
    for label, example_state, token_type, text in _example_table():
        if example_state != state:
            continue
        rank = (
            0
            if (token_type, text) == (token.type, str(token))
            else 1 if token_type == token.type else 2
        )
        if best is None or rank < best[0]:
            best = (rank, label)
    return best[1] if best else None


def _unexpected_character(exc: UnexpectedCharacters, lines: LineIndex, file: str) -> ParcError:
    line, column = exc.line, exc.column
    rest = (lines.line(line) or "")[column - 1 :]
    char = rest[:1]
    if char == '"':
        span = Span(
            file=file, line=line, column=column, end_line=line, end_column=column + len(rest)
        )
        return ParcError(
            span=span,
            code="PAR0003",
            message="unterminated string",
            hint='close it with `"` on the same line; write a newline inside a string as \\n',
        )
    shown = (
        f"`{char}`"
        if char.isprintable() and not char.isspace()
        else f"U+{ord(char):04X}" if char else "input"
    )
    span = Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
    hint = _HINT_FOR_CHAR.get(char)
    if char and unicodedata.digit(char, None) is not None:
        hint = f"digits are ASCII 0-9: `{char}` is {unicodedata.name(char, 'a digit').lower()}"
    return ParcError(span=span, code="PAR0002", message=f"unexpected character {shown}", hint=hint)


def _token_span(token: Token, lines: LineIndex, file: str) -> Span:
    if token.type == "$END" or token.line is None:
        # The end of the last line that has text: where the missing thing belongs.
        line = lines.last_line()
        column = len(lines.line(line)) + 1
        return Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
    if token.type == "_NL":
        # Point just past the end of the line, where the missing thing belongs.
        return Span(
            file=file,
            line=token.line,
            column=token.column,
            end_line=token.line,
            end_column=token.column + 1,
        )
    return span_between(file, token)


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "the end of the file"
    if token.type == "_NL":
        return "the end of the line" if not str(token).lstrip().startswith("#") else "a comment"
    if token.type == "STRING":
        return f"the string {token}"
    return f"`{clip(str(token), 30)}`"


def _bare(where: str) -> str:
    """ "the end of the file" → "end of file", for "unexpected ..." messages."""
    bare = {"the end of the file": "end of file", "the end of the line": "end of line"}.get(
        where, where
    )
    return bare[4:] if bare.startswith("the ") else bare


def _expected_words(expected) -> str:
    names = set(expected)
    words = []
    if {"STRING", "QUANTITY"} <= names:
        words.append("a value")
        names -= {"STRING", "QUANTITY", "ATOM", "LSQB", "LPAR"}
    if "ATOM" in names:
        words.append("a name")
    for name in sorted(names):
        if name in _PUNCTUATION:
            words.append(f"`{_PUNCTUATION[name]}`")
        elif name == "_NL":
            words.append("the end of the line")
        elif name == "$END":
            words.append("the end of the file")
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


def _previous(exc: UnexpectedInput) -> Token | None:
    history = getattr(exc, "token_history", None) or []
    if history and history[-1] is not None and history[-1].type == "ATOM":
        return history[-1]
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        stack = interactive.parser_state.value_stack
        if stack and isinstance(stack[-1], Token) and stack[-1].type == "ATOM":
            return stack[-1]
    return None


def _first_word(lines: LineIndex, line: int) -> str:
    """``"model "`` for the line ``model gpt {``: names a block in messages."""
    words = (lines.line(line) or "").split(maxsplit=1)
    word = words[0] if words else ""
    return f"`{word}` " if word.isidentifier() and word.isascii() and len(word) <= 30 else ""


def _line_start_token(exc: UnexpectedInput, token: Token) -> Token:
    """The first token of the line ``token`` is on (the next block's kind word)."""
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        for value in reversed(interactive.parser_state.value_stack):
            if isinstance(value, Token) and value.line == token.line and value.type == "ATOM":
                token = value
    return token
