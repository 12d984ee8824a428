"""What a failed checkpoint save costs (pure): the checkpoint, or the job.

A save runs after a commit and only reads the training state, so a save that failed on every rank
alike (`errors.agreed_failure`: a full disk, a permission error, a write that did not verify)
leaves the state in memory whole and the ranks in step. Failing stop then would throw away every
update since the previous checkpoint and restart into the same storage: the job goes on instead,
and the next due save tries again. But each failed save leaves the L2 fallback further behind, so
past `tolerated` failures in a row the job fails stop with the storage's error, for someone to
look at. A save whose own collective failed is not this rule's: the ranks may stand at different
points of it (`runtime.after_commit` hands that to a membership change, or fails stop)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FailedSaveVerdict:
    go_on: bool
    reason: str  # why the job goes on without this checkpoint, or why it fails stop


def judge_failed_save(*, agreed: bool, in_a_row: int, tolerated: int, last_saved: int | None) -> FailedSaveVerdict:
    """`in_a_row`: failed saves in a row, this one included; `tolerated`: how many may fail in a
    row (`Config.checkpoint_failures_tolerated`); `last_saved`: the newest step this run published."""
    behind = f"the newest checkpoint stays step {last_saved}" if last_saved is not None else "no checkpoint yet"
    if not agreed:
        return FailedSaveVerdict(False, "the save's own collective failed (the ranks may stand at different points "
                                        "of it)")
    if in_a_row > tolerated:
        return FailedSaveVerdict(False, f"{in_a_row} checkpoint save(s) in a row failed, more than "
                                        f"checkpoint_failures_tolerated={tolerated} ({behind})")
    return FailedSaveVerdict(True, f"failed on every rank alike: training goes on without this checkpoint "
                                   f"({in_a_row} of {tolerated} tolerated in a row; {behind})")
