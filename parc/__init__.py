"""parc: a compiler for distributed training.

The distribution's import names are namespaced under ``parc``: ``parc.dsl`` (the
language front end), ``parc.codegen`` (plan, lowering, rendering, CLI),
``parc.runtime`` (what generated trainers import) and ``parc.templates``.
"""

__version__ = "0.1.0"
