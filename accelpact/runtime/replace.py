"""ReplaceGroups handler: retire each failed group this rank holds and build one with identical
membership, a fresh store prefix and the data-plane timeout, at the agreed generation."""

from __future__ import annotations

import datetime

import torch.distributed as dist

from ..comm import replace_group
from ..fsm.effects import ReplaceGroups, StepResult
from .data_plane import DataPlane

#: label -> (retired group, replacement), filled by replace, read by rebind and validate
Pending = dict[str, tuple[dist.ProcessGroup, dist.ProcessGroup]]


def replace_groups(plane: DataPlane, rank: int, effect: ReplaceGroups, pending: Pending) -> StepResult:
    timeout = datetime.timedelta(seconds=plane.timeout_s)
    try:
        for gid in effect.groups:
            if plane.gids.get(gid.label) != gid:
                return StepResult(False, f"rank {rank} holds no group {gid.key}")
            old = plane.groups[gid.label]
            new = replace_group(old, ranks=gid.ranks, label=gid.label, generation=effect.generation, timeout=timeout)
            pending[gid.label] = (old, new)
    except Exception as exc:  # c10d/gloo raise many types here; the cause goes into the vote
        return StepResult(False, f"{type(exc).__name__}: {exc}")
    return StepResult(True)
