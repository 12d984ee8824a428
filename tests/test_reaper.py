"""The reaper frees retired groups on its own thread after a grace, never on the caller's."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from accelpact.comm import reaper


@pytest.fixture(autouse=True)
def long_grace(monkeypatch):
    """A grace no loaded machine outlasts between two statements: "not yet freed" is then sure."""
    monkeypatch.setattr(reaper, "GRACE_S", 1.0)


class Freed:
    """Records where and when its last reference went."""

    def __init__(self, log: list):
        self.log = log

    def __del__(self):
        self.log.append((threading.current_thread().name, time.monotonic()))


def test_a_handed_over_object_is_freed_on_the_reaper_thread_after_the_grace():
    log: list = []
    handed = time.monotonic()
    reaper.free_later(Freed(log))
    assert log == []  # not on the caller's thread, not at once
    assert reaper.pending() >= 1
    assert reaper.drain(reaper.GRACE_S + 5)
    assert reaper.pending() == 0
    [(thread, when)] = log
    assert thread == "accelpact-reaper"
    assert when - handed >= reaper.GRACE_S * 0.9


def test_the_grace_outlasts_a_reference_the_caller_drops_right_after_handing_over():
    log: list = []
    obj = Freed(log)
    reaper.free_later(obj)
    time.sleep(0.05)  # the caller still holds it a moment (a local, an argument)
    del obj
    assert log == []  # the reaper's reference is the last one now
    assert reaper.drain(reaper.GRACE_S + 5)
    assert [thread for thread, _ in log] == ["accelpact-reaper"]


def test_none_is_ignored_and_drain_reports_a_timeout():
    reaper.free_later(None)
    assert reaper.drain(reaper.GRACE_S + 5)
    log: list = []
    reaper.free_later(Freed(log))
    assert not reaper.drain(0.01)  # still inside its grace
    assert reaper.drain(reaper.GRACE_S + 5) and len(log) == 1


def _in_child(conn) -> None:
    log: list = []
    reaper.free_later(Freed(log))
    conn.send((reaper.drain(reaper.GRACE_S + 5), [thread for thread, _ in log]))


def test_a_forked_child_gets_a_reaper_of_its_own():
    reaper.free_later(None)
    reaper.free_later(Freed([]))  # the parent's thread is running
    parent, child = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_in_child, args=(child,))
    proc.start()
    try:
        assert parent.poll(30), "the child did not answer"
        assert parent.recv() == (True, ["accelpact-reaper"])
    finally:
        proc.join(10)
    assert reaper.drain(reaper.GRACE_S + 5)
