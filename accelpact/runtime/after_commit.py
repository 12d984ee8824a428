"""What runs right after a commit, on every rank alike and in this order: the replica digest
check (`digests.py`), then the checkpoint save (`checkpointing.py`), so that a checkpoint is
never taken of replicas that disagree. A failure of either fails stop on every rank together:
each rank holds the same agreed result (the gathered digests, the collective save's error).
A save that failed on every rank alike costs only that checkpoint, up to a number in a row
(`checkpoint.failed_saves`).

Both run on the control plane with nothing before them to detect a cut link: a cut that begins
inside a save stalls the save's first collective across it from its first second. A cut at an
update is given the data timeout to be detected and then the control timeout to heal (a Preserve
rides it out); so the work after a commit is given their sum (`budget_s`), and a link cut for
less than that stalls the save instead of failing the job to its last checkpoint.

Under membership (spares, shrink), a communication failure inside that work is a member lost (or
a control plane cut past the bound) at a committed frontier: the membership change takes it, as
it takes one at the boundary check, instead of a fail-stop. The save it interrupted stays
unpublished (the next save removes it); the new world takes the save of F right after the change's
release (`take_owed_save`), and the next one due on schedule."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..checkpoint import agreed_failure
from ..comm.classify import FailureCause, classify_failure
from ..errors import ControlPlaneError
from ..fsm.phases import FailurePhase
from .digests import ReplicaDivergence
from .listeners import tell_before_commit_work
from .member_change import on_lost_member

if TYPE_CHECKING:
    from .runtime import Runtime

#: what a lost peer (or a cut link) looks like from inside a collective of the work after a commit
LOST_PEER = (FailureCause.TIMEOUT, FailureCause.CONNECTION_CLOSED)


def lost_peer(exc: BaseException) -> bool:
    """Whether the work after a commit failed in its own collectives (a peer lost, the control
    plane cut), not on an error every rank agreed on (a full disk)."""
    if agreed_failure(exc):
        return False
    return isinstance(exc, ControlPlaneError) or classify_failure(exc).cause in LOST_PEER


def budget_s(rt: Runtime) -> float:
    """How long one collective after a commit may wait: what a cut at an update may last and still
    be recovered in memory (its detection, then the recovery's control-plane bound)."""
    return float(rt.config.data_timeout_s) + float(rt.config.control_timeout_s)


def after_commit(rt: Runtime) -> None:
    save_due = rt.checkpointer is not None and rt.checkpointer.due(rt.frontier)
    # with digests on, every save is checked first: a save between two checks could keep the
    # corrupt replica's bytes (DCP writes each shard from one holder), and the Reject of the next
    # check would restart from exactly that step
    digests_due = rt.digests is not None and (rt.digests.due(rt.frontier) or save_due)
    if not (digests_due or save_due):
        return  # the usual update: nothing to stretch
    _work(rt, digests_due=digests_due, save_due=save_due, owed=False)


def take_owed_save(rt: Runtime) -> None:
    """Right after the release of a membership change that interrupted the save of F
    (`MembershipDecision.save_owed`): every member of the new world takes it, the spare included,
    so the checkpoints keep their schedule. The fault hook before the work does not run again.
    With digests on, the replicas are checked first, as before every save (found by review: the
    owed save skipped it, and could keep a corrupt replica's bytes)."""
    if rt.checkpointer is not None:
        rt.checkpointer.interrupted_at = None  # owed no more: a loss inside this save marks it again
        _work(rt, digests_due=rt.digests is not None, save_due=True, owed=True)


def _work(rt: Runtime, *, digests_due: bool, save_due: bool, owed: bool) -> None:
    t0, failure = time.perf_counter(), None
    with rt.control.timeout_for(budget_s(rt)):
        if not owed:
            try:
                tell_before_commit_work(rt.listeners, rt.frontier)
            except ControlPlaneError as exc:
                failure = f"the control plane failed after the commit of F={rt.frontier}: {exc}", exc
        if digests_due and failure is None:
            try:
                rt.digests.after_commit(rt, before_save=save_due)
            except (ReplicaDivergence, ControlPlaneError) as exc:
                failure = f"replica digest check at F={rt.frontier}: {exc}", exc
        if save_due and failure is None:
            try:
                rt.checkpointer.after_commit(rt, owed=owed)
            except Exception as exc:  # judged below: every rank's alike, or a lost peer's
                verdict = rt.checkpointer.judge_failure(rt.frontier, exc)
                if not verdict.go_on:
                    failure = (f"checkpoint save at F={rt.frontier} failed: {type(exc).__name__}: {exc} "
                               f"[{verdict.reason}]", exc)
    if failure is None:
        return
    reason, exc = failure  # outside the stretch: what follows keeps the usual bound
    if rt.membership is not None and lost_peer(exc):
        if save_due:  # the save of F is not taken: this rank's presence tells the new world so
            rt.checkpointer.interrupted_at = rt.frontier
        on_lost_member(rt, exc, FailurePhase.COMMITTED, time.perf_counter() - t0)
        return
    rt._reject_without_protocol(reason, exc)
