"""The deferred boundary's check run on a thread of its own (`runtime.check_thread`): the check
runs off the training thread, a failed check is collected as its ControlPlaneError and rejects
the boundary when it is settled, a result nobody collected never answers a later ticket, a stuck
thread is an error rather than a hang, and close stops the thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from accelpact.errors import ControlPlaneError
from accelpact.runtime import check_thread, deferred
from accelpact.runtime.check_thread import CheckThread


def test_the_check_runs_on_its_own_thread_and_is_collected_by_ticket():
    ran_on: list[str] = []

    def check(flag, arrived):
        ran_on.append(threading.current_thread().name)
        return flag + int(arrived)

    checks = CheckThread(check)
    assert not checks.running  # started by the first check
    try:
        first = checks.start(0, 1.0)
        assert checks.running
        assert checks.result(first, 1.0) == 1
        checks.start(0, 2.0)  # never collected: a boundary rejected before it was settled
        third = checks.start(1, 3.0)
        assert checks.result(third, 1.0) == 4  # the stale result is dropped, not returned
    finally:
        checks.close()
    assert ran_on == ["accelpact-boundary-check"] * 3 and checks.ran == 3
    assert not checks.running
    checks.close()  # idempotent


def test_a_failed_check_is_collected_as_a_control_plane_error_with_its_cause():
    def check(flag, arrived):
        if flag:
            raise ControlPlaneError("boundary check #4 failed: Connection closed by peer")
        raise ValueError("a tensor of the wrong size")

    checks = CheckThread(check)
    try:
        with pytest.raises(ControlPlaneError, match="Connection closed by peer"):
            checks.result(checks.start(1, 0.0), 1.0)
        with pytest.raises(ControlPlaneError, match="ValueError: a tensor of the wrong size") as info:
            checks.result(checks.start(0, 0.0), 1.0)
        assert isinstance(info.value.__cause__, ValueError)
    finally:
        checks.close()


def test_a_check_that_never_ends_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(check_thread, "MARGIN_S", 0.1)
    release = threading.Event()
    checks = CheckThread(lambda flag, arrived: release.wait(5))
    try:
        with pytest.raises(ControlPlaneError, match="did not end within 0 s, longer than the control timeout"):
            checks.result(checks.start(0, 0.0), 0.1)
    finally:
        release.set()
        checks.close()


def test_close_marks_a_thread_still_inside_its_check_as_stuck(monkeypatch):
    """What `detach` reads to leave the control plane open under a wait that is still in it."""
    monkeypatch.setattr(check_thread, "JOIN_S", 0.1)
    release = threading.Event()
    checks = CheckThread(lambda flag, arrived: release.wait(5))
    checks.start(0, 0.0)
    checks.close()
    assert checks.stuck
    release.set()
    done = CheckThread(lambda flag, arrived: flag)
    done.result(done.start(0, 0.0), 1.0)
    done.close()
    assert not done.stuck


class _Rejected(Exception):
    pass


def test_a_deferred_boundary_whose_check_failed_is_rejected_when_it_is_settled():
    """The check fails on its thread; the training thread learns of it when it settles the
    boundary and rejects it without the protocol, naming the boundary and the cause."""
    said: list[str] = []

    def reject(why, exc, phase=None):  # `Runtime._reject_without_protocol`'s signature
        said.append(why)
        raise _Rejected(why) from exc

    def failing_check(flag, arrived):
        raise ControlPlaneError("boundary check #7 failed: Connection reset by peer")

    rt = SimpleNamespace(deferral=deferred.DeferralCounts(), _reject_without_protocol=reject,
                         config=SimpleNamespace(control_timeout_s=1.0))
    rt.deferral.checks = CheckThread(failing_check)
    try:
        ticket = rt.deferral.checks.start(0, 0.0)
        rt.deferral.pending = deferred.PendingBoundary(update=7, ticket=ticket, posted=0.0)
        with pytest.raises(_Rejected):
            deferred.settle(rt)
    finally:
        rt.deferral.stop()
    assert said == ["control plane failed at the deferred boundary of update 7: "
                    "boundary check #7 failed: Connection reset by peer"]
