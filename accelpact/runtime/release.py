"""VoteRelease and ForceReject handlers: the single outcome register.

Every rank posts its vote; rank 0 collects them, `decisions.decide_release` decides, rank 0
publishes "resume" or "reject" by compare-and-set; every rank follows the register's one value.
A rank that cannot complete this forces the register to reject, if it is still empty."""

from __future__ import annotations

import logging
import time

from ..control import ControlPlane
from ..errors import ControlPlaneError
from ..fsm.decisions import ReleaseVote, decide_release
from ..fsm.effects import ControlPlaneFailure, ForceReject, VoteRelease

log = logging.getLogger("accelpact.runtime")


def vote_release(control: ControlPlane, epoch: str, effect: VoteRelease) -> str | ControlPlaneFailure:
    deadline = time.monotonic() + control.timeout_s
    try:
        control.post_vote(epoch, ReleaseVote(control.rank, effect.ok, effect.reason))
        if control.rank == 0:
            release, reasons = decide_release(control.collect_votes(epoch), control.world_size)
            return control.publish_outcome(epoch, "resume" if release else "reject", reasons)
        return control.await_outcome(epoch, deadline - time.monotonic())
    except ControlPlaneError as exc:
        return ControlPlaneFailure(str(exc))


def force_reject(control: ControlPlane, epoch: str, effect: ForceReject) -> str:
    """The register's value after trying to set it to reject. If the store itself is gone, no
    rank can read "resume" from it either, so this rank's outcome is reject."""
    try:
        return control.force_reject(epoch, effect.reason)
    except ControlPlaneError as exc:
        log.error("outcome register unreachable: %s", exc, extra={"epoch": epoch})
        return "reject"
