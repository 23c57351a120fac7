"""The compiler's model record (Note [one model record] in dsl/spec.py): a ``ModelConfig``
whose shape the rules check with a diagnostic at the spec line, not ``__post_init__``'s
ValueError. The compiler's alone: a build does not ship it.
"""

from __future__ import annotations

from .model_desc import ModelConfig, _settle_head_dim


def unchecked_config(**fields) -> ModelConfig:
    """A ``ModelConfig`` of ``fields`` without ``__post_init__``'s checks: the compiler's record
    (Note [one model record] in dsl/spec.py), whose shape the rules hold with a diagnostic at
    the spec line (``parc check``, and the build's own ``check_values``), not a ValueError.
    Every field must be given; the trainer builds its ``ModelConfig`` checked."""
    names = ModelConfig.__dataclass_fields__
    if set(fields) != set(names):
        raise TypeError(f"unchecked_config: fields {sorted(set(names) ^ set(fields))} differ from ModelConfig's")
    config = object.__new__(ModelConfig)
    for name in names:
        object.__setattr__(config, name, fields[name])
    _settle_head_dim(config)
    return config
