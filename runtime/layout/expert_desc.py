"""The modules of a mixture-of-experts block's MLP, for the model description.

Takes: a ``ModelConfig`` with experts and a block's name prefix (``layers.3.``). Gives:
``moe_modules``, the ``ModuleDesc``s ``model_desc._block`` lists for an MoE block (the
router, the experts' grouped weights, the shared experts), in the order
runtime/parallel/expert/moe.py builds them. Pure Python, no torch; ``model_desc``
imports it for an MoE block only, so a dense build does not ship it (codegen/features.py,
the experts' entry); it imports the description's parts (model_parts.py), never
model_desc.py back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model_parts import GROUPED, LINEAR, ModuleDesc, ParamDesc

if TYPE_CHECKING:  # named in annotations only: model_desc.py imports this module, not the other way
    from .model_desc import ModelConfig


def replicated(name, kind, out_features, in_features, bias, *, sp=False):
    """``sp``: under sequence parallelism it sees a sequence shard (moe.py: the router and
    the shared experts), so its gradients are partial until summed over tp."""
    params = [ParamDesc(name="weight", shape=(out_features, in_features), sequence_parallel=sp)]
    if bias:
        params.append(ParamDesc(name="bias", shape=(out_features,), sequence_parallel=sp))
    return ModuleDesc(name=name, kind=kind, layer=LINEAR, style=None, params=tuple(params))


def moe_modules(config: ModelConfig, prefix: str) -> list[ModuleDesc]:
    """A mixture-of-experts MLP (runtime/parallel/expert/moe.py): the router (C → E), the experts as
    grouped weights (E, out, in) without biases, and the shared experts as one MLP of
    shared_experts · expert_ffn (biases for gpt, as its dense MLP). Replicated over tp."""
    C, E, F = config.hidden, config.experts, config.expert_hidden
    llama = config.arch == "llama"
    names = (("gate_proj", (E, F, C)),) if llama else ()
    names += (("up_proj", (E, F, C)), ("down_proj", (E, C, F)))
    modules = [replicated(prefix + "mlp.router", "mlp.router", E, C, False, sp=True)]
    modules += [
        ModuleDesc(name=f"{prefix}mlp.experts.{n}", kind=f"mlp.experts.{n}", layer=GROUPED, style=None,
                   params=(ParamDesc(name="weight", shape=shape),))
        for n, shape in names
    ]
    if config.shared_experts:
        S = config.shared_experts * F
        shared = (("gate_proj", S, C),) if llama else ()
        shared += (("up_proj", S, C), ("down_proj", C, S))
        modules += [replicated(f"{prefix}mlp.shared_experts.{n}", f"mlp.shared_experts.{n}", o, i, not llama, sp=True)
                    for n, o, i in shared]
    return modules
