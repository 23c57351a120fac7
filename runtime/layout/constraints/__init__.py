"""Every rule that decides whether a layout is legal and whether parc can build it.

Takes: plain values (numbers, strings, booleans, tuples) by their short names in
``KEYS`` — ``dp``, ``heads``, ``global_batch`` ... — a missing or ``None`` value being
unknown (``auto``, not given, or already reported bad). Gives: ``violations(values)``,
the ``Violation`` of each rule that fails, its message the formula with the values
filled in and a hint. A rule whose required values are unknown is skipped, so a
rule only reports what holds whatever the unknowns turn out to be (the search feeds
it partial layouts for that reason).

The front end (``dsl/checks.py``), the build (``codegen/passes/check_values.py``,
``check_buildable.py``), the layout search (``codegen/planner/search.py``, the cost model's
``buildable``) and the runtime (``model.ModelConfig``) all call this module, so
``parc check`` and ``parc build`` cannot disagree (``tests/test_check_build_contract.py``).
Torch-free (the standard library and ``axes.py`` only): ``parc.dsl`` may import it, and
a build vendors it as ``parc_runtime/layout/constraints/``.

Note [a rule is an entry]: a new parallel axis is an ``Axis`` of ``axes.py`` (whether it
joins the world product, what sizes its degree divides); a feature parc cannot build yet is
an ``Unbuildable`` entry; a pair of features it cannot build together a row of
``unbuilt_pairs.UNBUILT`` (Note [an unbuilt pair is a row]); a per-layer setting an entry of ``layer_settings.SETTINGS``; anything
else is one function decorated with ``@rule(code)`` whose parameters are names of
``KEYS`` (without a default: required, the rule is skipped while it is unknown; with
``= None``: optional); a value only a feature's rules read (its kind, its options) is
declared by that feature's rules module (Note [a feature declares its values] in
``rule_keys.py``), and a fact other features' rules read is a value it derives (Note [a derived
value] there). Context parallel is ``Axis("cp", ...)`` in ``axes.AXES``, its degree in
``world``, and ``rules_context.py``: its kind's value and two rules (``cp_divides_seq_len``,
``ulysses_heads``: they read sp, tp, the kind and the model, more than an axis's ``divides``
says); the planner searches cp (``cp = auto``) and costs it like any axis.
"""

from __future__ import annotations

from ..rule_engine import (  # noqa: F401
    BUILD, DERIVED, LAYOUT, RULES, Rule, Violation, _SELECTED, reads, _results, _run, _selected, _violation, divisors, entries, per_layer, rule, some, violations,
)
from ..rule_keys import KEYS, Derived, check_declared, declare, derive, holds, legal, padded_vocab, rules_of, smallest  # noqa: F401
from ..model_rules import heads_divide_hidden, kv_heads_divide_heads, kv_replicas, model_name, top_k_within_experts  # noqa: F401
from .rules_mesh import AXES, _SPLIT_WORDS, _WORDS, _and, _axis_divides, _failing, _grid_divides, _kv_heads_1d, _sizes, build_tp_2d_kv_heads, build_tp_2d_qk_norm, sequence_parallel_2d, tp_2d, tp_grid_fits, tp_grids, tp_kv_heads, tp_shape_product, tp_within_node, world  # noqa: F401
from .rules_context import _cp_parts, cp_divides_seq_len, ulysses_heads  # noqa: F401
from .rules_pipeline import PIPELINE_UNITS, chimera_pipelines, interleaved_needs_pipeline, layers_split_evenly, pipeline_units, stage_layers_fit, terapipe_slice_lengths, terapipe_slices, terapipe_slices_under_sp, zero_bubble_v_stages  # noqa: F401
from .rules_batch import batch_divides  # noqa: F401
from . import rules_overlap  # noqa: F401 - registers the overlap setting's rules (its name stays there)
from .rules_overlap import PER_LAYER, _one_entry_per_layer, sequence_parallel  # noqa: F401
from .rules_experts import ep_divides_experts, expert_fold, etp_divides_expert_ffn, experts_fold_ranks, moe_keys_need_experts  # noqa: F401
from .rules_training import TOKEN_IDS, compress_pp_needs_pipeline, vocab_fits_tokens, warmup_within_steps, zero_needs_data_ranks, zero_options_need_zero3, zero_shard_node, zero_shard_node_experts  # noqa: F401
from .unbuilt_pairs import SWITCHES, UNBUILT, Switch, Unbuilt, markdown, matrix, matrix_text  # noqa: F401
from .rules_unbuilt import UNBUILDABLE, Unbuildable, _unbuildable  # noqa: F401
from .rules_hetero import _hetero_unbuilt, hetero_degrees_divide, hetero_lengths, hetero_micro_batch, hetero_products, hetero_stage_boundaries, hetero_unbuilt, layer_degrees, master_weights  # noqa: F401

check_declared(RULES)  # Note [a feature declares its values]: every rules module has declared by now
