"""ReplaceGroups handler: retire the failed groups this rank holds and build, for each, one with
identical membership and the same backends (an NCCL data plane stays NCCL), on a fresh store
prefix, with the data-plane timeout, at the agreed generation; or, where agreement said every
member holds one, adopt the group's standby (`runtime.standby`) instead of building.

The failed groups are retired together before anything is built: NCCL communicators are aborted
in one window (one after the other they can deadlock on dependent work in flight), and no
replacement's init has to wait behind a communicator that still holds the device."""

from __future__ import annotations

import datetime
import logging

import torch.distributed as dist

from ..comm import replace_group
from ..comm.backends import backend_spec, parse_backends, uses_nccl
from ..comm.lifecycle import retire_groups
from ..fsm.effects import ReplaceGroups, StepResult
from .data_plane import DataPlane

log = logging.getLogger("accelpact.runtime")

#: label -> (retired group, replacement), filled by replace, read by rebind and validate
Pending = dict[str, tuple[dist.ProcessGroup, dist.ProcessGroup]]


def replace_groups(plane: DataPlane, rank: int, effect: ReplaceGroups, pending: Pending) -> StepResult:
    timeout = datetime.timedelta(seconds=plane.timeout_s)
    for gid in effect.groups:
        if plane.gids.get(gid.label) != gid:
            return StepResult(False, f"rank {rank} holds no group {gid.key}")
    olds = {gid.label: plane.groups[gid.label] for gid in effect.groups}
    try:
        specs = {label: plane.backend_specs.get(label) or backend_spec(old) for label, old in olds.items()}
        missing = sorted(label for label, spec in specs.items() if spec is None)
        if missing:
            return StepResult(False, f"rank {rank} cannot tell the backend of {missing}")
        adopt = dict(effect.standby)
        standbys = {gid.label: plane.standby.take(gid.label, adopt[gid.key]) for gid in effect.groups if gid.key in adopt}
        lost = sorted(label for label, standby in standbys.items() if standby is None)
        if lost:  # it reported them: only a bug can lose them in between
            return StepResult(False, f"rank {rank} reported standbys for {lost} but holds none of the agreed token")
        nccl = [old for label, old in olds.items() if uses_nccl(parse_backends(specs[label]))]
        retire_groups(nccl, abort=True)
        for gid in effect.groups:
            new = replace_group(olds[gid.label], ranks=gid.ranks, label=plane.replacement_label(gid.label),
                                generation=effect.generation, timeout=timeout, backend=specs[gid.label],
                                standby=standbys.get(gid.label))
            pending[gid.label] = (olds[gid.label], new)
    except Exception as exc:  # c10d/gloo/NCCL raise many types here; the cause goes into the vote
        log.error("replacing the failed groups failed on rank %d", rank, exc_info=exc)  # and its traceback here
        return StepResult.failed(exc)
    return StepResult(True)
