"""Rank functions that exercise the GPU path's decisions on CPU (tests/test_gpu_path.py).

NCCL cannot run here, so the NCCL *builder* is replaced by a stand-in that records what it was
asked for and builds a gloo backend in its place; everything around it — reading the failed
group's backends from c10d, aborting the failed groups together before anything is built,
registering the replacement under the failed group's backend — is the production code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import _c10d, group_identity, make_group, replace_group, validate_group
from ..comm import backends as backends_module
from ..comm.backends import BUILDERS, backend_spec, register_builder
from ..fsm.decisions import GroupId
from ..fsm.effects import ReplaceGroups


class _Plane:
    """The part of `DataPlane` the replace handler reads."""

    def __init__(self, groups: dict[str, dist.ProcessGroup], timeout_s: float):
        self.groups = dict(groups)
        self.gids = {label: GroupId(label, tuple(sorted(dist.get_process_group_ranks(pg))))
                     for label, pg in groups.items()}
        self.timeout_s = timeout_s
        self.backend_specs = {label: backend_spec(pg) for label, pg in groups.items()}

    def replacement_label(self, label: str) -> str:
        return label


def backends_world(rank: int, world_size: int) -> dict:
    from ..runtime.replace import replace_groups
    from ..runtime.standby import StandbyPool

    members = list(range(world_size))
    out: dict = {}
    # gloo stays gloo when the caller names no backend
    plain = make_group(members, label="bp-gloo", generation=0, timeout=10)
    again = replace_group(plain, ranks=members, label="bp-gloo", generation=1, timeout=10)
    out["gloo_spec"] = backend_spec(again)
    out["gloo_config"] = dist.get_backend_config(again)
    out["gloo_validated"] = validate_group(again, members).observed_sum

    # "nccl" through a stand-in builder: what is asked for, in which order
    events: list[tuple] = []
    gloo_builder = BUILDERS["gloo"]

    def fake_nccl(request):
        events.append(("build", request.name, str(request.device), request.timeout.total_seconds()))
        backend, _ = gloo_builder(backends_module._for_device(request, torch.device("cpu")))
        return backend, backends_module.ProcessGroup.BackendType.GLOO

    real_abort_together = _c10d.abort_together

    def recording_abort(pgs):
        events.append(("abort", sorted(group_identity(pg) for pg in pgs)))
        real_abort_together(pgs)

    previous = register_builder("nccl", fake_nccl)
    real_current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    _c10d.abort_together = recording_abort
    try:
        groups = {label: make_group(members, label=label, generation=0, timeout=10, backend="nccl")
                  for label in ("bp-shard", "bp-replicate")}
        out["nccl_spec_before"] = {label: backend_spec(pg) for label, pg in groups.items()}
        events.append(("built",))
        plane = _Plane(groups, timeout_s=7.0)
        pending: dict = {}
        result = replace_groups(plane, rank, ReplaceGroups(groups=tuple(sorted(plane.gids.values())),
                                                           generation=1), pending)
        out["replace_ok"], out["replace_reason"] = result.ok, result.reason
        out["nccl_spec_after"] = {label: backend_spec(new) for label, (_, new) in pending.items()}
        out["nccl_config_after"] = {label: dist.get_backend_config(new) for label, (_, new) in pending.items()}
        out["old_registered"] = {label: _c10d.is_registered(old) for label, (old, _) in pending.items()}

        # Config.standby_groups="all": NCCL groups get standbys too, through the same builder, while
        # nothing fails; a repair aborts the failed communicators together as before and builds nothing
        plane.groups = {label: new for label, (_, new) in pending.items()}
        plane.standby = StandbyPool("all")
        events.append(("standby",))
        plane.standby.fill(plane, plane.groups, token=1)
        events.append(("filled",))
        agreed = tuple((gid.key, 1) for gid in sorted(plane.gids.values()))
        adopted: dict = {}
        result = replace_groups(plane, rank, ReplaceGroups(groups=tuple(sorted(plane.gids.values())), generation=2,
                                                           standby=agreed), adopted)
        out["adopt_ok"], out["adopt_reason"] = result.ok, result.reason
        out["adopted"] = {label: (new.group_name, group_identity(new), backend_spec(new),
                                  dist.get_process_group_ranks(new))
                          for label, (_, new) in adopted.items()}
    finally:
        register_builder("nccl", previous)
        torch.cuda.current_device = real_current_device
        _c10d.abort_together = real_abort_together
    out["events"] = events
    return out
