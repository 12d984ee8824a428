"""The deferred committed boundary: its effects (the rule is `fsm.deferral`, pure).

A clean rank inside ``rt.step`` posts its boundary flag without waiting (the check runs on a
thread of its own, `check_thread`) and goes on into the next update. The flag is settled before
that update makes anything permanent: in its optimizer.step() pre-hook, at its failure or
boundary, at ``rt.update()`` entry, or at close.

- Flag 0: the boundary commits then, as a synchronous one would have (F+1, the FSM edge, metrics).
- Flag > 0: a peer needs the recovery of that boundary. This rank throws the next update's partial
  work away (the Rewind discard, then the boundary snapshot's RNG, data cursor and buffers) and
  joins the recovery with the state it had at the boundary: agreement sees what a synchronous
  boundary would have shown. If the next update failed in a collective meanwhile (it met a peer
  that had gone to the recovery), that group's connections may be closed for good, and this rank
  cannot tell which: it reports every group it holds as failed, so a Preserve rebuilds them.

The price is detection: a rank that went past the boundary learns of a peer's recovery at its
next optimizer step, or after a data timeout when its next collective waits on that peer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..errors import AccelPactError, ControlPlaneError
from ..fsm.deferral import DeferralFacts, why_synchronous
from ..fsm.effects import Quiesce
from ..fsm.phases import FailurePhase
from .check_thread import CheckThread
from .listeners import tell_before_check

log = logging.getLogger("accelpact.runtime")


class PeerNeedsRecovery(AccelPactError, RuntimeError):
    """Raised in the next update's optimizer.step() pre-hook: a peer needs the recovery of the
    boundary this rank went past, so the step must not be applied."""

    failure_cause = "a peer needs the recovery of the deferred boundary"


@dataclass
class PendingBoundary:
    update: int  # the update whose boundary was posted
    ticket: int  # the check handed to its thread (`CheckThread.result` gives its flag)
    posted: float  # time.perf_counter() at the post
    flag: int | None = None  # the agreed flag, once waited for
    failure: ControlPlaneError | None = None  # the control plane failed while it was waited for


@dataclass
class DeferralCounts:
    """`rt.deferral`: the boundary in flight, and how many were deferred / joined a recovery."""

    pending: PendingBoundary | None = None
    deferred: int = 0
    joined: int = 0
    checks: CheckThread | None = None  # its thread starts with the first deferred boundary
    #: what a join could not throw away of the next update (`_abandon`): the recovery it joins
    #: fails its guard with it (that recovery, at a committed boundary, discards nothing itself)
    left: tuple[str, ...] = ()

    def stop(self) -> None:
        if self.checks is not None:
            self.checks.close()


def defer(rt, arrived: float) -> bool:
    """At a clean committed boundary: post the check without waiting when the rule allows it.
    True: posted (nothing is committed until `settle`)."""
    if rt.config.boundary != "deferred":  # the default: nothing to look at on the per-update path
        return False
    checkpoint, digests = rt.checkpointer, rt.digests
    facts = DeferralFacts(mode=rt.config.boundary, in_step=rt.rewind.in_step,
                          rewind_phases=rt.envelope.rewind_phases, step_copy=rt.config.step_copy,
                          has_cursor=rt.data_state is not None,
                          checkpoint_due=bool(checkpoint is not None and checkpoint.every
                                              and (rt.frontier + 1) % checkpoint.every == 0),
                          digest_due=digests is not None and digests.due(rt.frontier + 1),
                          rewind_refused=rt.rewind.refused_always(),
                          snapshot_problem="" if rt.rewind.snapshot is not None else rt.rewind.snapshot_problem)
    if why_synchronous(facts) is not None:
        return False
    tell_before_check(rt.listeners, rt.update_index)
    if rt.deferral.checks is None:  # reads rt.stragglers when it runs: a membership change replaces it
        rt.deferral.checks = CheckThread(lambda flag, at: rt.stragglers.settle(rt.stragglers.post(flag, at)))
    ticket = rt.deferral.checks.start(0, arrived)  # a failed check is collected as its error (settle)
    rt.deferral.pending = PendingBoundary(rt.update_index, ticket, time.perf_counter())
    rt.deferral.deferred += 1
    return True


def settle(rt, error: BaseException | None = None, *, rerun: bool = True) -> bool:
    """Settle the boundary in flight: commit it (False), or join its recovery (True; with
    `rerun`, the thrown-away update runs again afterwards: `rt.step`'s loop). Never called
    inside the user's update body: a Reject raised there would be taken for the body's error."""
    pending = rt.deferral.pending
    if pending is None:
        return False
    flag = _agreed_flag(rt, pending)  # an interrupt in this wait leaves the boundary pending: close() settles it
    rt.deferral.pending = None
    if flag is None:  # recorded against the update whose boundary failed, not the one after it
        rt.update_index = pending.update
        rt._reject_without_protocol(f"control plane failed at the deferred boundary of update {pending.update}: "
                                    f"{pending.failure}", error or pending.failure, FailurePhase.COMMITTED)
    if pending.flag == 0:
        rt._commit(time.perf_counter() - pending.posted)  # timed from its body's end (`Observers.commit`)
        return False
    _join(rt, pending, error, rerun=rerun)
    return True


def settle_before_step(rt) -> None:
    """The optimizer.step() pre-hook of the next update: its step must not be applied before
    the boundary it went past is agreed. A clean flag commits here; anything else unwinds the
    update (PeerNeedsRecovery) so that its boundary, outside the user's code, joins or rejects."""
    pending = rt.deferral.pending
    if pending is None:
        return
    if _agreed_flag(rt, pending) == 0:
        rt.deferral.pending = None
        rt._commit(time.perf_counter() - pending.posted)
        return
    raise PeerNeedsRecovery(f"the boundary of update {pending.update} is not clean "
                            f"({pending.failure or 'a peer needs its recovery'}): update {rt.update_index} "
                            "is thrown away") from pending.failure  # the control plane's own error, if it failed


def _agreed_flag(rt, pending: PendingBoundary) -> int | None:
    """Wait for the posted check once (its flag is kept); None: the control plane failed."""
    if pending.flag is None and pending.failure is None:
        try:
            pending.flag = rt.deferral.checks.result(pending.ticket, float(rt.config.control_timeout_s))
        except ControlPlaneError as exc:
            pending.failure = exc
    return pending.flag


def _join(rt, pending: PendingBoundary, error: BaseException | None, *, rerun: bool) -> None:
    failed: list = []
    cause = f"a peer needs the recovery of the boundary of update {pending.update}"
    if error is not None and not isinstance(error, PeerNeedsRecovery):
        cause_of_next, communication = rt.data_plane.diagnose(error)
        if communication:
            failed = list(rt.data_plane.held())
        cause += f"; update {pending.update + 1} thrown away after {cause_of_next}"
    _abandon(rt, failed, next_update_ran=rt.update_index > pending.update)
    rt.update_index = pending.update
    rt.deferral.joined += 1
    log.warning("rank %d joins the recovery of the deferred boundary of update %d: %s", rt.rank, pending.update, cause)
    rt._recover(None, FailurePhase.COMMITTED, bool(failed), failed, cause, time.perf_counter() - pending.posted, None)
    rt._rewound = rerun


def _abandon(rt, failed: list, *, next_update_ran: bool) -> None:
    """Back to the boundary: the next update's partial work discarded, then RNG, data cursor
    and buffers from the boundary snapshot. After a failed collective the guard's order holds
    (abort the failed groups on a GPU, then synchronise, then discard); without one nothing is
    stuck and no group may be aborted (a Preserve keeps the groups nobody reported)."""
    if not next_update_ran:
        return
    from .discard import discard_partial_update, partial_state
    from .guard import guard

    if failed:
        verdict, _ = guard(rt.model, rt.optimizer, Quiesce(discard=True, failed=tuple(failed)), rt.data_plane)
        left = [] if verdict.ok else [verdict.reason]
    else:
        try:
            discard_partial_update(rt.model, rt.optimizer)
            left = list(partial_state(rt.model, rt.optimizer))
        except (RuntimeError, AttributeError, ValueError) as exc:  # framework state we cannot reset
            left = [f"discarding it failed: {type(exc).__name__}: {exc}"]
    if rt.rewind.snapshot is None:  # found by review: the restore was skipped without a word
        left.append(f"no boundary snapshot to restore ({rt.rewind.snapshot_problem or 'none was taken'})")
    else:
        try:
            rt.rewind.snapshot.restore(rt.data_state)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # as `restore_boundary`: into the vote
            log.error("restoring the boundary snapshot of a deferred boundary failed", exc_info=exc)
            left.append(f"restoring the boundary snapshot failed: {type(exc).__name__}: {exc}")
    if left:  # the recovery's guard fails with it (`RecoveryExecutor.quiesce`): the decision rejects
        log.error("rank %d could not throw the update after a deferred boundary away: %s", rt.rank, "; ".join(left))
        rt.deferral.left = tuple(left)
