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
from ..fsm.effects import ControlPlaneFailure, ForceReject, OutcomeUnknown, VoteRelease

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


def force_reject(control: ControlPlane, epoch: str, effect: ForceReject) -> str | OutcomeUnknown:
    """The register's value after trying to set it to reject, retried for the control timeout.
    A store this rank cannot reach may still be reachable by its peers, who may read "resume"
    from it: so an unreachable register is no "reject" (TLC's local_reject mutant), the outcome
    is unknown and the rank stops without one."""
    try:
        return control.force_reject_within(epoch, effect.reason, control.timeout_s)
    except ControlPlaneError as exc:
        log.error("outcome register unreachable: %s", exc, extra={"epoch": epoch})
        return OutcomeUnknown(str(exc))
