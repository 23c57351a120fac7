"""The planner's analytical cost model: memory and time of a layout on a machine.

``estimate(spec, layout, hardware, accounting)`` → ``Estimate``; the parts live in
``layout`` (what a rank holds), ``memory``, ``time`` (with ``comm`` and ``bubble``)
and ``hardware`` (presets, calibration, ``parc profile`` files). docs/planner.md
describes the model; ``codegen/planner/search.py`` ranks layouts with it.
"""

from .estimate import Estimate, estimate
from .fit import hardware_for
from .hardware import Hardware
from .layout import Accounting, Layout

__all__ = ["Accounting", "Estimate", "Hardware", "Layout", "estimate", "hardware_for"]
