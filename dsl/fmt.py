"""Syntax tree → canonical text (``parc fmt``), and a readable tree dump.

Takes: a ``Document`` from ``dsl/parse.py``. Gives: ``format_document`` (the
canonical form: idempotent, and ``parse(fmt(x))`` equals ``parse(x)`` up to spans),
``format_value`` (one value as canonical text, used in messages) and ``dump`` (the
tree, one node a line, for ``parc build --emit ast``).

The canonical form: blocks in the order written, one blank line between them; two
spaces of indent; ``key = value`` one a line; values on one line with ``, `` between
items and `` = `` in keyword arguments; numbers exactly as written; a unit one space
after its number; strings re-escaped; trailing commas dropped.

Note [comments in fmt]: every comment is kept, in order. A comment alone on its line
stays alone on its line, at the indent of where it is; a comment after an entry,
a block's ``{`` or its ``}`` stays after it, two spaces away. A comment inside a
value that spans lines moves to its own line just above that entry (values are
printed on one line). A blank line (or several) between two lines of a block, or
between top-level comments, becomes one blank line; there are none right after
``{`` or before ``}``.
"""

from __future__ import annotations

from operator import attrgetter

from . import ast

INDENT = "  "


def format_value(value: ast.Value) -> str:
    if isinstance(value, ast.Number):
        return value.text
    if isinstance(value, ast.Quantity):
        return f"{value.number.text} {value.unit}"
    if isinstance(value, ast.String):
        return quote(value.value)
    if isinstance(value, ast.Name):
        return value.name
    if isinstance(value, ast.Bool):
        return "true" if value.value else "false"
    if isinstance(value, ast.Auto):
        return "auto"
    if isinstance(value, ast.ListValue):
        return "[" + ", ".join(format_value(item) for item in value.items) + "]"
    if isinstance(value, ast.TupleValue):
        inner = ", ".join(format_value(item) for item in value.items)
        return f"({inner},)" if len(value.items) == 1 else f"({inner})"
    if isinstance(value, ast.Call):
        arguments = ", ".join(
            format_value(a.value) if a.name is None else f"{a.name} = {format_value(a.value)}"
            for a in value.arguments
        )
        return f"{value.name}({arguments})"
    raise TypeError(f"internal error in parc (fmt): not a value: {value!r}")


def quote(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


class _Comments:
    """The document's comments, handed out in order as the printer walks the tree.

    The printer asks for lines in increasing order, so the comments not yet printed
    are always those from ``next`` on: each question looks at the front only, and
    formatting takes time linear in the number of comments.
    """

    def __init__(self, comments: tuple[ast.Comment, ...]):
        self.sorted = sorted(comments, key=attrgetter("span.line", "span.column"))
        self.next = 0

    def _take_while(self, keep) -> list[ast.Comment]:
        start = self.next
        while self.next < len(self.sorted) and keep(self.sorted[self.next]):
            self.next += 1
        return self.sorted[start : self.next]

    def before(self, line: int) -> list[ast.Comment]:
        """Comments on lines before ``line`` not yet printed."""
        start, comments = self.next, self.sorted
        end = start
        while end < len(comments) and comments[end].span.line < line:
            end += 1
        self.next = end
        return comments[start:end]

    def inside(self, first: int, end: int) -> list[ast.Comment]:
        """Comments on lines ``first`` ≤ line < ``end`` not yet printed."""
        return self._take_while(lambda c: first <= c.span.line < end)

    def on(self, line: int) -> ast.Comment | None:
        """A comment on ``line`` (there is at most one: it runs to the end of the line)."""
        taken = self._take_while(lambda c: c.span.line == line)
        return taken[0] if taken else None

    def rest(self) -> list[ast.Comment]:
        """Every comment not yet printed."""
        start, self.next = self.next, len(self.sorted)
        return self.sorted[start:]


class _Printer:
    def __init__(self, doc: ast.Document):
        self.comments = _Comments(doc.comments)
        self.lines: list[str] = []
        self.last_line = 0  # source line of what was printed last
        self.opened = False  # the line printed last opened a block
        self.doc = doc

    def emit(self, text: str, source_line: int, *, blank_before: bool | None = None) -> None:
        """Print ``text`` (from ``source_line``), after one blank line where the source
        had a gap, unless ``blank_before`` says otherwise; never right after ``{``."""
        if blank_before is None:
            blank_before = source_line > self.last_line + 1
        if blank_before and self.lines and self.lines[-1] != "" and not self.opened:
            self.lines.append("")
        self.lines.append(text.rstrip())
        self.opened = False
        self.last_line = max(self.last_line, source_line)

    def trailing(self, text: str, line: int) -> str:
        comment = self.comments.on(line)
        return f"{text}  {comment.text}" if comment else text

    def full_line_comments(
        self, line: int, indent: str, *, first_blank: bool | None = None
    ) -> None:
        self.emit_comments(self.comments.before(line), indent, first_blank)

    def emit_comments(self, comments: list, indent: str, first_blank: bool | None) -> None:
        """``emit`` each comment alone on its line at ``indent``, the first with
        ``blank_before=first_blank``. Note [emitting comments]: this is ``emit``
        unrolled over the list (a file may hold a million comments; a call each cost
        a second): after the first line, ``opened`` is False and the last line printed
        is not blank, so only a gap in the source can add a blank line."""
        if not comments:
            return
        first, *others = comments
        self.emit(indent + first.text, first.span.line, blank_before=first_blank)
        lines, last_line = self.lines, self.last_line
        append = lines.append
        for comment in others:
            line = comment.span.line
            if line > last_line + 1:
                append("")
            append((indent + comment.text).rstrip())
            if line > last_line:
                last_line = line
        self.last_line = last_line

    def item(self, item, after_block: bool) -> None:
        start = item.span.line
        self.full_line_comments(start, "", first_blank=True if after_block else None)
        blank = True if after_block and not self._just_commented(start) else None
        if isinstance(item, ast.BlockAssign):
            text = f"{item.kind} = {format_value(item.value)}"
            if self.comments_inside(item.value.span, "", blank_before=blank):
                blank = False
            self.emit(self.trailing(text, item.span.end_line), start, blank_before=blank)
            return
        header = item.kind + (f" {item.name}" if item.name is not None else "") + " {"
        first_entry_line = item.entries[0].span.line if item.entries else None
        header_comment = None if first_entry_line == start else self.comments.on(start)
        if header_comment is not None:
            header = f"{header}  {header_comment.text}"
        self.emit(header, start, blank_before=blank)
        self.opened = True
        for entry in item.entries:
            self.full_line_comments(entry.span.line, INDENT)
            gap = entry.span.line > self.last_line + 1
            if self.comments_inside(entry.span, INDENT, blank_before=gap):
                gap = False
            text = f"{INDENT}{entry.key} = {format_value(entry.value)}"
            self.emit(self.trailing(text, entry.span.end_line), entry.span.line, blank_before=gap)
            self.last_line = entry.span.end_line
        end = item.span.end_line
        self.full_line_comments(end, INDENT)
        closer = self.trailing("}", end)
        if self.opened and "#" not in self.lines[-1]:
            self.lines[-1] += closer
            self.opened = False
        else:
            self.emit(closer, end, blank_before=False)
        self.last_line = end

    def _just_commented(self, line: int) -> bool:
        """True when the line printed last was a comment directly above ``line``."""
        return (
            bool(self.lines)
            and self.lines[-1].lstrip().startswith("#")
            and self.last_line == line - 1
        )

    def comments_inside(
        self, span: ast.Span, indent: str, *, blank_before: bool | None = None
    ) -> bool:
        """Comments on the inner lines of a value that spans lines go above the entry;
        True if there were any."""
        inside = self.comments.inside(span.line, span.end_line)
        for i, comment in enumerate(inside):
            self.emit(
                indent + comment.text, span.line, blank_before=blank_before if i == 0 else False
            )
        return bool(inside)

    def run(self) -> str:
        after_block = False
        for item in self.doc.items:
            self.item(item, after_block)
            after_block = True
        self.emit_comments(self.comments.rest(), "", True if after_block else None)
        return "\n".join(self.lines) + "\n" if self.lines else ""


def format_document(doc: ast.Document) -> str:
    """The canonical text of ``doc`` (see the module docstring and Note [comments in fmt])."""
    return _Printer(doc).run()


def dump(doc: ast.Document) -> str:
    """The tree, one node a line with its position: ``Entry layers @3:3``."""
    out: list[str] = [f"Document {doc.span.file}"]

    def at(span: ast.Span) -> str:
        return f"@{span.line}:{span.column}"

    def value(node: ast.Value, depth: int, label: str = "") -> None:
        pad = "  " * depth + label
        if isinstance(node, ast.Call):
            out.append(f"{pad}Call {node.name} {at(node.span)}")
            for argument in node.arguments:
                value(
                    argument.value,
                    depth + 1,
                    "" if argument.name is None else f"{argument.name} = ",
                )
        elif isinstance(node, (ast.ListValue, ast.TupleValue)):
            out.append(f"{pad}{type(node).__name__} {at(node.span)}")
            for item in node.items:
                value(item, depth + 1)
        elif isinstance(node, ast.Quantity):
            out.append(f"{pad}Quantity {node.number.text} {node.unit} {at(node.span)}")
        else:
            out.append(f"{pad}{type(node).__name__} {format_value(node)} {at(node.span)}")

    for item in doc.items:
        if isinstance(item, ast.BlockAssign):
            out.append(f"  BlockAssign {item.kind} {at(item.span)}")
            value(item.value, 2)
            continue
        name = f" {item.name}" if item.name is not None else ""
        out.append(f"  Block {item.kind}{name} {at(item.span)}")
        for entry in item.entries:
            out.append(f"    Entry {entry.key} {at(entry.span)}")
            value(entry.value, 3)
    for comment in doc.comments:
        out.append(f"  Comment {comment.text!r} {at(comment.span)}")
    return "\n".join(out) + "\n"
