"""Syntax tree → the normalized JSON document, with where each value came from.

Takes: a ``Document`` (``dsl/parse.py``). Gives: ``Normalized``: the document the
JSON Schema describes (``dsl/schema.py``), the origin (spans, text as written) of
every value in it, and the errors only this stage can see: unknown or duplicate
blocks and keys, units of the wrong kind, calls to unknown functions or with
unknown arguments. Types, ranges and required keys are left to the schema
(``dsl/validate.py``), so each mistake is reported once.

``normalize_value`` is also how ``--set`` values are read (``dsl/overrides.py``).

Note [per-layer values]: a key marked ``per_layer`` in ``dsl/keys/`` takes one
value or a list with one value per transformer block (``recompute = [full, none]``);
each item is normalized as the single value would be, at path ``(block, key, i)``,
and ``dsl/checks.py`` checks that the list has ``model.layers`` items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ast, units
from .diagnostics import DUPLICATES_SHOWN, ParcError, Span, clip, did_you_mean
from .fmt import format_value
from .keys import BLOCKS, LAYERS_MAX, UNIT_TYPES, BlockDef, Param, expected_words, list_element

Path = tuple  # ("train", "optimizer", "lr"), ("parallel", "stage_layers", 0)


@dataclass(slots=True)
class Origin:
    """Where the value at one path of the document was written."""

    span: Span
    """The value (for a block: its kind word, e.g. ``model``)."""
    key_span: Span | None = None
    """The key (or argument name) naming it, if any."""
    text: str = ""
    """The value as written, for messages."""


@dataclass(slots=True)
class Normalized:
    doc: dict = field(default_factory=dict)
    origins: dict[Path, Origin] = field(default_factory=dict)
    errors: list[tuple[Path, ParcError]] = field(default_factory=list)
    """Each error with the path it is about; an override of that path drops it."""
    bad: set[Path] = field(default_factory=set)
    """Paths whose value this stage refused; the schema is not asked about them."""
    start: Span | None = None
    """Where errors about the whole file (a missing block) point."""

    def error(
        self, path: Path, span: Span, code: str, message: str, hint: str | None = None
    ) -> None:
        self.errors.append((path, ParcError(span=span, code=code, message=message, hint=hint)))

    def drop(self, path: Path) -> None:
        """Forget ``path`` and everything under it (an override replaces it)."""

        def under(p: Path) -> bool:
            return p[: len(path)] == path

        self.errors = [(p, e) for p, e in self.errors if not under(p)]
        self.bad = {p for p in self.bad if not under(p)}
        for p in [p for p in self.origins if under(p) and p != path[:1]]:
            del self.origins[p]


_BAD = object()
LIST_MAX = LAYERS_MAX
"""Most values a list may hold: the longest list of the language is one value per layer
(``stage_layers``, ``compress_stages`` and a sliced schedule's slices are fewer, PAR0266). A longer
one is refused before its values are read one by one (a million took seconds)."""
"""Duplicates of one key reported one by one; the rest are counted in one more error."""
"""What ``normalize_value`` returns for a value it refused (and reported)."""


def dotted(path: Path) -> str:
    return ".".join(str(part) for part in path)


def normalize_document(doc: ast.Document) -> Normalized:
    out = Normalized(start=Span(file=doc.span.file, line=1, column=1, end_line=1, end_column=2))
    first_seen: dict[str, Span] = {}
    suggested: list[Path] = []
    for item in doc.items:
        block = BLOCKS.get(item.kind)
        if block is None:
            near = did_you_mean(item.kind, BLOCKS)
            out.error(
                (item.kind,),
                item.kind_span,
                "PAR0101",
                f"unknown block `{clip(item.kind)}`",
                f"did you mean `{near}`?" if near else "blocks are " + ", ".join(BLOCKS),
            )
            if near:
                suggested.append((near,))
            continue
        if item.kind in first_seen:
            out.error(
                (item.kind, "#duplicate"),
                item.kind_span,
                "PAR0102",
                f"duplicate `{item.kind}` block (the first is on line {first_seen[item.kind].line})",
                "merge the two blocks into one",
            )
            continue
        first_seen[item.kind] = item.kind_span
        if isinstance(item, ast.BlockAssign):
            _block_assign(out, block, item)
        else:
            _block(out, block, item)
    _quiet(out, suggested)
    return out


def _quiet(out: Normalized, suggested: list[Path]) -> None:
    """A misspelt block or key already says "did you mean X"; if X is then missing,
    do not also report it missing."""
    for path in suggested:
        container = out.doc
        for part in path[:-1]:
            container = container.get(part) if isinstance(container, dict) else None
        if isinstance(container, dict) and path[-1] not in container:
            out.bad.add(path)


def _block_assign(out: Normalized, block: BlockDef, item: ast.BlockAssign) -> None:
    path = (block.name,)
    out.origins[path] = Origin(span=item.kind_span, text=format_value(item.value))
    if block.may_be_auto and isinstance(item.value, ast.Auto):
        out.doc[block.name] = "auto"
        out.origins[path] = Origin(span=item.value.span, key_span=item.kind_span, text="auto")
        return
    out.bad.add(path)
    if block.may_be_auto:
        out.error(
            path,
            item.value.span,
            "PAR0114",
            f"`{block.name} = ...` takes only `auto`",
            f"write `{block.name} = auto`, or a block `{block.name} {{ ... }}`",
        )
    else:
        name = " NAME" if block.named else ""
        out.error(
            path,
            item.kind_span,
            "PAR0114",
            f"`{block.name}` is a block, not a value",
            f"write `{block.name}{name} {{`, its entries one a line, then `}}`",
        )


def _block(out: Normalized, block: BlockDef, item: ast.Block) -> None:
    suggested: list[Path] = []
    path = (block.name,)
    values: dict = {}
    out.doc[block.name] = values
    out.origins[path] = Origin(span=item.kind_span, text=block.name)
    if block.named and item.name is None:
        out.error(
            path + ("name",),
            item.kind_span,
            "PAR0114",
            f"the {block.name} block needs a name",
            f"write `{block.name} NAME {{`, e.g. `{block.name} gpt_tiny {{`",
        )
        out.bad.add(path + ("name",))
    elif block.named:
        values["name"] = item.name
        out.origins[path + ("name",)] = Origin(
            span=item.name_span, key_span=item.name_span, text=item.name
        )
    elif item.name is not None:
        out.error(
            path,
            item.name_span,
            "PAR0114",
            f"the {block.name} block takes no name",
            f"write `{block.name} {{`",
        )
    seen: dict[str, ast.Entry] = {}
    duplicates: dict[str, list[ast.Entry]] = {}
    for entry in item.entries:
        key = block.key(entry.key)
        if key is None:
            near = did_you_mean(entry.key, [k.name for k in block.keys])
            hint = (
                f"did you mean `{near}`?"
                if near
                else "keys: " + ", ".join(k.name for k in block.keys)
            )
            if block.named and entry.key == "name":
                hint = f"the name goes after the word `{block.name}`: `{block.name} NAME {{`"
            elif near:
                suggested.append(path + (near,))
            out.error(
                path + (entry.key,),
                entry.key_span,
                "PAR0104",
                f"unknown key `{clip(entry.key)}` in the {block.name} block",
                hint,
            )
            continue
        if entry.key in seen:
            again = duplicates.setdefault(entry.key, [])
            again.extend([entry] * (1 + entry.repeated))  # Note [duplicates counted]: their count
            if len(again) <= DUPLICATES_SHOWN:
                out.error(
                    path + (entry.key, "#duplicate"),
                    entry.key_span,
                    "PAR0105",
                    f"duplicate key `{entry.key}` (first set on line {seen[entry.key].key_span.line})",
                    "remove one of them",
                )
            continue
        seen[entry.key] = entry
        _put(out, path + (entry.key,), key, entry.value, entry.key_span)
    for name, again in duplicates.items():
        if len(again) > DUPLICATES_SHOWN:
            rest = again[DUPLICATES_SHOWN:]
            out.error(
                path + (name, "#duplicate"),
                rest[0].key_span,
                "PAR0105",
                f"duplicate key `{name}` set {len(rest):,} more times, on lines {rest[0].key_span.line} to "
                f"{rest[-1].key_span.line} (first set on line {seen[name].key_span.line})",
                f"remove them: a key is set once a block (the first {DUPLICATES_SHOWN} duplicates are shown above)",
            )
    _quiet(out, suggested)


def set_value(
    out: Normalized, path: Path, param: Param, value: ast.Value, key_span: Span | None
) -> None:
    """Normalize ``value`` for ``param`` and put it at ``path`` of the document, in
    place of what was there (an override)."""
    out.drop(path)
    _put(out, path, param, value, key_span)


def _put(out: Normalized, path: Path, param: Param, value: ast.Value, key_span: Span | None) -> None:
    """``set_value`` where nothing is yet at ``path``: ``drop`` walks every error and
    origin, and a block of 100k entries must not walk them once per entry."""
    result = normalize_value(out, path, param, value, key_span)
    container = out.doc
    for part in path[:-1]:
        if not isinstance(container.get(part), dict):
            container[part] = {}
        container = container[part]
    if result is _BAD:
        out.bad.add(path)
        container.pop(path[-1], None)
    else:
        container[path[-1]] = result


def normalize_value(
    out: Normalized, path: Path, param: Param | None, value: ast.Value, key_span: Span | None
):
    """The JSON form of ``value`` where ``param`` is expected (None: unknown)."""
    name = dotted(path)
    if isinstance(value, (ast.ListValue, ast.TupleValue)) and len(value.items) > LIST_MAX:
        out.origins[path] = Origin(span=value.span, key_span=key_span, text=f"[{len(value.items):,} values]")
        out.error(path, value.span, "PAR0116",
                  f"`{name}` has {len(value.items):,} values, but a list holds at most {LIST_MAX:,}",
                  "a per-layer list has one value per layer (model.layers is at most "
                  f"{LAYERS_MAX:,}); give one value for all layers instead")
        return _BAD
    out.origins[path] = Origin(span=value.span, key_span=key_span, text=format_value(value))
    unit_kind = param.type if param is not None and param.type in UNIT_TYPES else None
    if isinstance(value, ast.Quantity):
        if value.unit not in units.UNITS:  # a semantic error: the file's other errors are reported too
            out.error(path, value.unit_span, "PAR0012", f"unknown unit `{clip(value.unit)}`",
                      units.suggest_unit(value.unit))
            return _BAD
        kind, factor = units.UNITS[value.unit]
        if param is not None and unit_kind is None:
            out.error(
                path,
                value.unit_span,
                "PAR0112",
                f"`{name}` takes a plain number, not {units.KIND_WORDS[kind]} ({format_value(value)})",
                f"remove the unit: `{value.number.text}`",
            )
            return _BAD
        if unit_kind is not None and kind != unit_kind:
            hint = f"write {units.KIND_WORDS[unit_kind]}, such as {units.KIND_EXAMPLES[unit_kind]}"
            if kind == units.SIZE and unit_kind == units.BANDWIDTH:
                hint = f"a bandwidth is per second: `{format_value(value)}/s`"
            out.error(
                path,
                value.unit_span,
                "PAR0110",
                f"{units.KIND_WORDS[kind]} where {units.KIND_WORDS[unit_kind]} belongs: "
                f"`{name}` = {format_value(value)}",
                hint,
            )
            return _BAD
        return value.number.value * factor
    if isinstance(value, ast.Number):
        if unit_kind is not None:
            out.error(
                path,
                value.span,
                "PAR0111",
                f"`{name}` needs a unit: {units.KIND_WORDS[unit_kind]} such as "
                f"{units.KIND_EXAMPLES[unit_kind]}",
                "units: " + " ".join(units.units_of(unit_kind)),
            )
            return _BAD
        return value.value
    if isinstance(value, ast.Auto):
        return "auto"
    if isinstance(value, ast.Bool):
        return value.value
    if isinstance(value, ast.String):
        return value.value
    if param is not None and param.type == "call" and isinstance(value, (ast.Name, ast.Call)):
        return _call(out, path, param, value)
    if isinstance(value, ast.Name):
        return value.name
    if isinstance(value, ast.ListValue) and param is not None and param.per_layer:
        one = list_element(param)  # Note [per-layer values]: [v0, v1, ...]
        items = [normalize_value(out, path + (i,), one, item, None) for i, item in enumerate(value.items)]
        return _BAD if any(item is _BAD for item in items) else items
    if isinstance(value, (ast.ListValue, ast.TupleValue)):
        element = None if param is None else list_element(param)
        items = [
            normalize_value(out, path + (i,), element, item, None)
            for i, item in enumerate(value.items)
        ]
        if any(item is _BAD for item in items):
            return _BAD
        return items
    if isinstance(value, ast.Call):
        out.error(
            path,
            value.span,
            "PAR0107",
            f"`{name}` expects {expected_words(param) if param else 'a plain value'}, "
            f"not a call `{value.name}(...)`",
        )
        return _BAD
    raise TypeError(f"internal error in parc (normalize): {value!r}")  # pragma: no cover


def _call(out: Normalized, path: Path, param: Param, value: ast.Name | ast.Call):
    function = value.name
    span = value.span if isinstance(value, ast.Name) else value.name_span
    call = param.call(function)
    name = dotted(path)
    if call is None:
        near = did_you_mean(function, [c.name for c in param.calls])
        choices = "expected one of " + ", ".join(c.signature() for c in param.calls)
        out.error(
            path,
            span,
            "PAR0108",
            f"unknown {param.name} `{clip(function)}` for `{name}`",
            f"did you mean `{near}`? {choices}" if near else choices,
        )
        return _BAD
    result: dict = {"kind": function}
    if isinstance(value, ast.Name):
        return result
    ok = True
    for index, argument in enumerate(value.arguments):
        if argument.name is None:
            if index >= len(call.params):
                out.error(
                    path + (f"#{index}",),
                    argument.span,
                    "PAR0113",
                    f"`{function}` takes {len(call.params)} argument"
                    f"{'s' if len(call.params) != 1 else ''}, got {len(value.arguments)}",
                    f"`{call.signature()}`",
                )
                ok = False
                continue
            target = call.params[index]
        else:
            target = call.param(argument.name)
            if target is None:
                near = did_you_mean(argument.name, [p.name for p in call.params])
                out.error(
                    path + (argument.name,),
                    argument.name_span,
                    "PAR0113",
                    f"`{function}` has no argument `{clip(argument.name)}`",
                    f"did you mean `{near}`?" if near else f"`{call.signature()}`",
                )
                ok = False
                continue
        if target.name in result:
            out.error(
                path + (target.name, "#duplicate"),
                argument.span,
                "PAR0105",
                f"argument `{target.name}` of `{function}` is given twice",
                "remove one of them",
            )
            ok = False
            continue
        item = normalize_value(
            out, path + (target.name,), target, argument.value, argument.name_span
        )
        if item is _BAD:
            ok = False
        else:
            result[target.name] = item
    return result if ok else _BAD
