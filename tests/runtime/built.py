"""The tests' one call for a model of some layout: what train.py writes as lines.

``build(config, seed=..., ...)`` runs ``model.build_model`` (or ``build_stages`` with
``stages=``), the transforms of ``parallelize`` the arguments ask for, in their one order
(``runtime/layout/transforms.ORDER``), then ``init_weights`` and ``use_kernels``, as the
generated train.py does. Tests outside tests/runtime put this folder on ``sys.path``.
"""

from __future__ import annotations

from parc.runtime.models import model, parallelize


def build(config, *, seed, device="cpu", tp_group=None, sequence_parallel=False, tp_plan=None, grid=None,
          layouts=None, cp_group=None, cp_kind=None, ep_group=None, etp_group=None, recompute=None,
          sub_batches=None, kernels="compiled", materialize=True, init_on_device=None, stages=None, pp_rank=0,
          pp_size=1, placement="interleaved"):
    net = plain(config, stages=stages, pp_rank=pp_rank, pp_size=pp_size, placement=placement)
    net = transform(net, tp_group=tp_group, sequence_parallel=sequence_parallel, tp_plan=tp_plan, grid=grid,
                    layouts=layouts, cp_group=cp_group, cp_kind=cp_kind, ep_group=ep_group, etp_group=etp_group,
                    recompute=recompute, sub_batches=sub_batches)
    net = model.init_weights(net, seed=seed, device=device, materialize=materialize, init_on_device=init_on_device)
    return model.use_kernels(net, kernels, device)


def plain(config, *, stages=None, pp_rank=0, pp_size=1, placement="interleaved"):
    if stages is None:
        return model.build_model(config)
    return model.build_stages(config, stages=stages, pp_rank=pp_rank, pp_size=pp_size, placement=placement)


def transform(net, *, tp_group=None, sequence_parallel=False, tp_plan=None, grid=None, layouts=None, cp_group=None,
              cp_kind=None, ep_group=None, etp_group=None, recompute=None, sub_batches=None):
    """The plain ``net`` (no values yet) in the layout the arguments name."""
    net = parallelize.tensor(net, tp_group, tp_plan or {}, sequence_parallel=sequence_parallel, grid=grid,
                             layouts=layouts)
    if cp_group is not None:
        net = parallelize.context(net, cp_group, cp_kind)
    if ep_group is not None or etp_group is not None:
        net = parallelize.experts(net, ep_group, etp_group)
    if recompute is not None:
        net = parallelize.recompute(net, recompute)
    if sub_batches is not None:
        net = parallelize.overlap(net, sub_batches)
    return net
