"""ValidateGroups handler: an integer all-reduce on each replacement, its result checked."""

from __future__ import annotations

from ..comm import validate_group
from ..fsm.effects import StepResult, ValidateGroups
from .data_plane import DataPlane
from .replace import Pending


def validate_groups(plane: DataPlane, effect: ValidateGroups, pending: Pending) -> StepResult:
    try:
        for label, (_, new) in pending.items():
            validate_group(new, plane.gids[label].ranks, timeout=plane.probe_timeout())
    except Exception as exc:  # a failed collective raises whatever gloo raises; the cause is the vote
        return StepResult(False, f"{type(exc).__name__}: {exc}")
    return StepResult(True)
