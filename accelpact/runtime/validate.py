"""ValidateGroups handler: an integer all-reduce on each replacement, its result checked (all
posted at once: a Rewind's every group in one round trip)."""

from __future__ import annotations

from ..comm.validate import validate_groups as validate_all
from ..fsm.effects import StepResult, ValidateGroups
from .data_plane import DataPlane
from .replace import Pending


def validate_groups(plane: DataPlane, effect: ValidateGroups, pending: Pending) -> StepResult:
    try:
        validate_all([(new, plane.gids[label].ranks) for label, (_, new) in pending.items()],
                     timeout=plane.probe_timeout())
    except Exception as exc:  # a failed collective raises whatever gloo raises; the cause is the vote
        return StepResult.failed(exc)
    return StepResult(True)
