"""The diagnostics the build stages raise, and the helper that places them.

Takes: a ``Spec`` and the dotted key an error is about. Gives: ``ParcError`` values
with the span of that key (or of the nearest enclosing key the spec wrote), and
``fail(errors)`` raising ``Diagnostics``. Codes of the build stage are ``PAR08xx``:

=========  =====================================================================
PAR0801    a value is still ``auto`` (the planner fills it; build needs it set)
PAR0802    a feature parc cannot build yet (ring attention, ...)
PAR0803    a name that is not a plain identifier (it would be emitted as code)
PAR0804    a value of the wrong type, not finite, or out of range
PAR0808    (warning) a written layout is predicted over the usable device memory
=========  =====================================================================

The layout rules (world size, divisibility, batch, schedule) and the buildability
rules live in ``runtime/layout/constraints/``; the build re-checks them (``check_values``,
``check_buildable``) with the codes and messages ``parc check`` gives (PAR02xx, and
PAR0802, which ``parc check`` reports too), because the code generator must be safe for
any ``Spec``, validated or not. PAR0805–PAR0807 (the build's own mesh, divisibility and
batch codes) are retired: one rule, one code.
"""

from __future__ import annotations

from typing import Iterable, NoReturn

from parc.dsl.diagnostics import Diagnostics, ParcError, Span
from parc.dsl.spec import Spec

AUTO = "PAR0801"
UNSUPPORTED = "PAR0802"
BAD_NAME = "PAR0803"
BAD_VALUE = "PAR0804"
MEMORY = "PAR0808"


def span_of(spec: Spec, key: str) -> Span:
    """Where ``key`` was written, else its nearest written parent, else the file start."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        span = spec.span(".".join(parts[:end]))
        if span is not None:
            return span
    prefix = parts[0] + "."
    for name, span in spec.spans:
        if name.startswith(prefix):
            return span
    return Span(file=spec.source, line=1, column=1, end_line=1, end_column=1)


def error(spec: Spec, key: str, code: str, message: str, hint: str | None = None) -> ParcError:
    return ParcError(span=span_of(spec, key), code=code, message=message, hint=hint)


def profile_error(spec: Spec, exc: Exception) -> ParcError:
    """The mesh's profile cannot be read (``cost.hardware.ProfileError``): quoted at ``mesh.profile``."""
    return error(spec, "mesh.profile", BAD_VALUE, str(exc), "run parc profile -o FILE and name FILE")


def fail(errors: Iterable[ParcError]) -> NoReturn:
    raise Diagnostics(list(errors))


def check(errors: list[ParcError]) -> None:
    """Raise the collected errors, if any (a pass reports all of its problems at once)."""
    if errors:
        fail(errors)


class InternalError(RuntimeError):
    """A broken invariant of parc itself (not of the user's spec)."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"internal error in parc ({stage}): {message}")
