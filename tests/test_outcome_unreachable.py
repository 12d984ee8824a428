"""A rank that cannot reach the outcome register must not decide alone.

TLC's local_reject mutant (spec/mutants/local_reject.cfg) is what the runtime used to do: when the
store was unreachable, `force_reject` returned "reject", so under a partial partition one rank
rejected while its peers read "resume" from the register (an OutcomeAgreement violation). The spec
now proves the fix, Halt: retry within the control timeout, and if the register stays out of
reach, stop without claiming an outcome (no Reject edge, no "reject" answer)."""

from __future__ import annotations

import datetime
import time

from accelpact.control.auth import Sealer
from accelpact.control.plane import ControlPlane
from accelpact.fsm.decisions import AgreementDecision, GroupId
from accelpact.fsm.driver import Observation, run_recovery
from accelpact.fsm.effects import (
    ControlPlaneFailure,
    ForceReject,
    GatherReports,
    GuardVerdict,
    OutcomeUnknown,
    Quiesce,
    RebindReferences,
    ReplaceGroups,
    StepResult,
    ValidateGroups,
    VoteRelease,
)
from accelpact.fsm.machine import RecoveryContext, RecoveryMachine
from accelpact.fsm.phases import FailurePhase, Phase, RecoveryAction
from accelpact.runtime import release


class FlakyStore:
    """A store that is unreachable for its first `down` operations, then holds `register`."""

    def __init__(self, down: int, register: str | None):
        self.down, self.register, self.calls = down, register, 0

    def _op(self):
        self.calls += 1
        if self.calls <= self.down:
            raise RuntimeError("Connection reset by peer")

    def set(self, key, value):
        self._op()

    def compare_set(self, key, expected, desired):
        self._op()
        return self.register if self.register is not None else desired


def _plane(store, timeout_s: float) -> ControlPlane:
    plane = ControlPlane.__new__(ControlPlane)  # no process group: only the register is used here
    plane.rank, plane.seq, plane.forged, plane.timeout_s = 1, 7, {}, timeout_s
    plane.sealer = Sealer(b"k" * 32, "ns")
    plane.store = store
    return plane


def test_an_unreachable_register_is_no_reject():
    plane = _plane(FlakyStore(down=10**9, register=None), timeout_s=0.5)
    t0 = time.monotonic()
    got = release.force_reject(plane, "r1", ForceReject("vote could not be posted"))
    assert isinstance(got, OutcomeUnknown), got  # the old code returned "reject" here
    assert "unreachable" in got.reason
    assert 0.3 <= time.monotonic() - t0 < 2.0, "it retries for the control timeout, then gives up"
    assert plane.store.calls > 1
    assert plane.seq == 7, "forcing the register is no protocol step, however many tries"


def test_a_register_back_within_the_timeout_is_obeyed_even_if_it_says_resume():
    sealer = Sealer(b"k" * 32, "ns")
    store = FlakyStore(down=2, register=sealer.seal("resume", "r1", "outcome"))
    plane = _plane(store, timeout_s=5.0)
    assert release.force_reject(plane, "r1", ForceReject("slow store")) == "resume"
    # it goes on beside peers that never forced the register: its next gather must be sealed at
    # their step, or every peer would read it as forged
    assert plane.seq == 7


class _Exec:
    """A member of the failed group whose repair succeeds, then loses the store before the outcome."""

    def __init__(self, gather_fails: bool = False):
        self.gather_fails = gather_fails

    def __call__(self, effect):
        if isinstance(effect, Quiesce):
            return GuardVerdict(True)
        if isinstance(effect, GatherReports):
            return ControlPlaneFailure("gather timed out") if self.gather_fails else [effect.report, _peer()]
        if isinstance(effect, (ReplaceGroups, RebindReferences, ValidateGroups)):
            return StepResult(True)
        if isinstance(effect, VoteRelease):
            return ControlPlaneFailure("store unreachable while awaiting the outcome")
        if isinstance(effect, ForceReject):
            return OutcomeUnknown("store unreachable for 5.0 s")
        raise AssertionError(effect)


def _peer():
    from accelpact.fsm.decisions import RankReport

    return RankReport(rank=0, frontier=3, generation=0, opt_step=3, failure_phase=FailurePhase.COMMITTED,
                      failed_groups=(GroupId("replicate", (0, 1)),), guard_ok=True)


def _run(executor) -> tuple[object, RecoveryMachine]:
    machine = RecoveryMachine(RecoveryContext(rank=1))
    obs = Observation(rank=1, world_size=2, frontier=3, generation=0, opt_step=3,
                      failure_phase=FailurePhase.COMMITTED, saw_failure=True,
                      failed_groups=(GroupId("replicate", (0, 1)),))
    gen = run_recovery(machine, obs)
    result = None
    while True:
        try:
            effect = gen.send(result)
        except StopIteration as stop:
            return stop.value, machine
        result = executor(effect)


def test_a_rank_that_cannot_read_the_outcome_halts_in_validate_without_a_reject_edge():
    outcome, machine = _run(_Exec())
    assert isinstance(machine.ctx.decision, AgreementDecision)
    assert outcome.halted and outcome.action is RecoveryAction.REJECT  # fail-stop, nothing resumed
    assert machine.phase is Phase.VALIDATE
    assert not any(dst == "Reject" for _, _, dst in machine.taken)
    assert "without claiming an outcome" in outcome.reasons[0]


def test_a_rank_that_cannot_read_the_outcome_while_agreeing_does_not_abort():
    outcome, machine = _run(_Exec(gather_fails=True))
    assert outcome.halted and machine.phase is Phase.AGREE
    assert "abort" not in [t for t, _, _ in machine.taken]


def test_rank_0_that_cannot_publish_the_outcome_forces_the_register_like_any_rank():
    """A store error while publishing must become the control-plane failure the driver handles
    (force the register, then follow it), not a raw RuntimeError out of rt.step with no exit 75."""
    from accelpact.fsm.effects import ControlPlaneFailure, VoteRelease

    class VotesThenDown(FlakyStore):
        def wait(self, keys, timeout=None):
            pass

        def multi_get(self, keys):
            return [Sealer(b"k" * 32, "ns").seal({"ok": True, "reason": ""}, "r1", "vote", r) for r in range(1)]

        def compare_set(self, key, expected, desired):
            raise RuntimeError("DistNetworkError: Connection reset by peer")

    plane = _plane(VotesThenDown(down=0, register=None), timeout_s=0.5)
    plane.rank, plane.world_size = 0, 1
    plane.clock, plane.timeout = None, datetime.timedelta(seconds=0.5)
    got = release.vote_release(plane, "r1", VoteRelease(True, ""))
    assert isinstance(got, ControlPlaneFailure) and "publishing the outcome failed" in got.reason


def test_a_reject_every_rank_decided_but_none_could_record_says_so():
    """Found by review: after a REJECT decision the ForceReject's result was ignored, so a rank
    whose register was unreachable reported a recorded reject like any other."""
    import dataclasses

    class _RejectedByAll(_Exec):
        def __call__(self, effect):
            if isinstance(effect, GatherReports):
                return [effect.report, dataclasses.replace(_peer(), guard_ok=False, guard_reason="stuck")]
            return super().__call__(effect)

    outcome, machine = _run(_RejectedByAll())
    assert outcome.action is RecoveryAction.REJECT and outcome.halted
    assert "not recorded" in outcome.reasons[-1] and "guard failed on rank 0" in " ".join(outcome.reasons)


class _BlackHoledStore:
    """A store behind a link cut without a reset: every call blocks (as TCPStore's did, far past
    its own timeout, behind a relay that stopped forwarding)."""

    def __init__(self):
        import threading

        self.released = threading.Event()

    def _block(self, *args):
        self.released.wait(30)
        raise RuntimeError("released at teardown")

    set = get = check = multi_get = _block

    def compare_set(self, key, expected, desired):
        return self._block()

    def wait(self, keys, timeout):
        return self._block()


def test_a_store_behind_a_cut_link_costs_the_control_timeout_not_the_tcp_timeout():
    """Found by review: only `wait` took a timeout; `compare_set` and `get` blocked on the socket,
    so a rank cut off from the store's host sat in the release for TCP's ~15 min instead of C."""
    from accelpact.control.bounded import BoundedStore, StoreUnresponsive

    hole = _BlackHoledStore()
    try:
        plane = _plane(BoundedStore(hole, bound_s=0.3), timeout_s=0.6)
        t0 = time.monotonic()
        got = release.force_reject(plane, "r1", ForceReject("vote could not be posted"))
        assert isinstance(got, OutcomeUnknown) and "did not answer" in got.reason
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        try:
            plane.await_outcome("r1", timeout_s=0.2)
        except Exception as exc:  # ControlPlaneError, caused by StoreUnresponsive
            assert isinstance(exc.__cause__, StoreUnresponsive), exc
        else:
            raise AssertionError("await_outcome returned from a black-holed store")
        assert time.monotonic() - t0 < 0.2 + 1.0 + 0.5  # its wait, the slack, and no more
    finally:
        hole.released.set()


def test_a_bounded_store_passes_results_and_errors_through():
    from accelpact.control.bounded import BoundedStore

    class Plain:
        def get(self, key):
            return b"v:" + key.encode()

        def check(self, keys):
            raise RuntimeError(f"no {keys}")

    store = BoundedStore(Plain(), bound_s=1.0)
    assert store.get("k") == b"v:k"
    import pytest

    with pytest.raises(RuntimeError, match=r"no \['a'\]"):
        store.check(["a"])
    with pytest.raises(ValueError, match="positive"):
        BoundedStore(Plain(), bound_s=0)
    import threading

    def workers():
        return [t for t in threading.enumerate() if t.name == "accelpact-store" and t.is_alive()]

    before = len(workers())
    for _ in range(50):  # one long-lived worker, not a thread per call
        store.get("k")
    assert len(workers()) <= before + 1
    store.close()
    deadline = time.monotonic() + 2.0
    while len(workers()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(workers()) <= before


def test_a_control_plane_left_behind_ends_its_store_worker():
    """Found by review: a membership change replaced the control plane but only stopped its link
    listener, so every change left one `accelpact-store` thread blocked on its queue for good."""
    import threading

    import torch.distributed as dist

    from accelpact.control.bounded import BoundedStore
    from accelpact.control.plane import ControlPlane

    def workers():
        return [t for t in threading.enumerate() if t.name == "accelpact-store" and t.is_alive()]

    before = len(workers())
    plane = ControlPlane.__new__(ControlPlane)
    plane._reach_listener = None
    plane.store = BoundedStore(dist.HashStore(), bound_s=1.0)
    plane.store.set("k", "v")  # its worker runs
    assert len(workers()) == before + 1
    plane.left_behind()
    deadline = time.monotonic() + 2.0
    while len(workers()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(workers()) == before
