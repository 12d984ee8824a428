"""Stacks taken during a hang, not after it: the watch's decision (pure), its thread on a blocked
thread, the report's line, and a 2-rank gloo job with a `stall` fault whose incident records show
where each rank hung (the stalled rank inside the stall, its peer inside backward's all-reduce)
rather than the recovery code the evidence is written from."""

from __future__ import annotations

import json
import threading
import time

import pytest

from accelpact.config import Config
from accelpact.errors import ConfigError
from accelpact.observe.hang_watch import Armed, HangWatch, next_look
from accelpact.run_report import hang_line
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world

# ------------------------------------------------------------------------------ the decision (pure)


def test_the_watch_looks_again_at_the_deadline_and_takes_each_phase_once():
    armed = Armed(update=3, phase="backward", update_since=10.0, phase_since=11.0)
    assert next_look(None, None, 12.0, 0.5) == 0.5  # idle: look again in one threshold
    assert next_look(armed, None, 11.2, 0.5) == pytest.approx(0.3)  # wait exactly for the deadline
    assert next_look(armed, None, 11.5, 0.5) is None  # due: take the stacks now
    assert next_look(armed, armed, 20.0, 0.5) == 0.5  # this phase was taken: never twice
    again = Armed(update=3, phase="backward", update_since=10.0, phase_since=11.0)
    assert next_look(again, armed, 20.0, 0.5) is None  # re-armed (a rewound update's phase): a new one


def test_the_fraction_is_checked():
    assert Config().hang_watch_fraction == 0.5
    assert Config().with_env({"ACCELPACT_HANG_WATCH_FRACTION": "0"}).hang_watch_fraction == 0.0  # off
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="hang_watch_fraction must be in \\[0, 1\\)"):
            Config(hang_watch_fraction=bad)
    with pytest.raises(ConfigError, match="hang_watch_fraction must be a number, got 'half'"):
        Config(hang_watch_fraction="half")


# ------------------------------------------------------------------------------ the thread


def _stuck_in_a_collective(release: threading.Event) -> None:
    release.wait(10)


def test_the_thread_takes_the_stacks_while_the_phase_hangs_and_a_recovery_freezes_it():
    watch = HangWatch(0.05)
    watch.start()
    try:
        watch.arm(4, "forward")
        time.sleep(0.02)
        watch.arm(4, "backward")  # the update goes on: its start is kept, the phase's is new
        release = threading.Event()
        threading.Timer(0.3, release.set).start()
        _stuck_in_a_collective(release)  # the training thread hangs here for 0.3 s
        watch.freeze()  # the recovery begins: nothing it runs is taken
        time.sleep(0.2)
        taken = watch.take(4)
    finally:
        watch.close()
    assert taken is not None and (taken.update, taken.phase) == (4, "backward")
    assert taken.phase_ran_s >= 0.05 and taken.update_ran_s >= taken.phase_ran_s + 0.015
    main = next(frames for name, frames in taken.stacks.items() if name.startswith("MainThread "))
    assert any("in _stuck_in_a_collective" in f for f in main), main
    assert watch.take(4) is None  # taken once
    assert not watch._thread.is_alive()


def test_a_phase_shorter_than_the_threshold_leaves_nothing_and_a_commit_disarms():
    calls = []
    watch = HangWatch(0.2, stacks=lambda: calls.append(1) or {})
    watch.start()
    try:
        watch.arm(1, "forward")
        time.sleep(0.05)
        watch.on_commit(1, 0)  # the update committed well inside the threshold
        time.sleep(0.4)
        assert calls == [] and watch.take(1) is None
        watch.arm(2, "committed")
        time.sleep(0.35)
        assert len(calls) == 1 and watch.take(1) is None  # a snapshot of update 2 is not update 1's evidence
    finally:
        watch.close()


def test_the_report_says_where_the_main_thread_hung():
    hang = {"update": 2, "phase": "forward", "phase_ran_s": 0.5, "update_ran_s": 0.52, "stacks": {
        "accelpact-hang-watch (2)": ["/x/threading.py:1 in run: self._target()"],
        "MainThread (1)": ["/r/accelpact/faults/injector.py:78 in on_phase: perform(fault)",
                           "/r/accelpact/faults/inject.py:49 in perform: time.sleep(STALL_FACTOR * data_timeout_s)"]}}
    assert hang_line(hang) == ("0.50 s into forward of update 2 (update 0.52 s; 2 threads in incidents-rank<r>.jsonl): "
                               "faults/inject.py:49 in perform: time.sleep(STALL_FACTOR * data_timeout_s) <- "
                               "faults/injector.py:78 in on_phase: perform(fault)")


def test_a_training_thread_waiting_for_the_deferred_check_is_reported_with_where_the_check_waits():
    from accelpact import run_report
    from accelpact.runtime.check_thread import THREAD_NAME

    assert run_report.CHECK_THREAD == THREAD_NAME
    hang = {"update": 5, "phase": "backward", "phase_ran_s": 1.0, "update_ran_s": 1.1, "stacks": {
        "MainThread (1)": ["/r/accelpact/runtime/deferred.py:125 in _agreed_flag: pending.flag = ...",
                           "/r/accelpact/runtime/check_thread.py:61 in result: got, flag, failure = self._done.get(...)"],
        f"{THREAD_NAME} (2)": ["/r/accelpact/runtime/stragglers.py:55 in settle: result = ...",
                               "/r/accelpact/control/plane.py:181 in boundary_result: work.wait()"]}}
    assert hang_line(hang).endswith("runtime/check_thread.py:61 in result: got, flag, failure = self._done.get(...) <- "
                                    "runtime/deferred.py:125 in _agreed_flag: pending.flag = ... "
                                    "(the check's thread: control/plane.py:181 in boundary_result: work.wait())")


# ------------------------------------------------------------------------------ a stalled rank, 2 ranks


def _incidents(trace_dir, rank: int) -> list[dict]:
    path = trace_dir / f"incidents-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _main_thread(hang: dict) -> list[str]:
    return next(frames for name, frames in hang["stacks"].items() if name.startswith("MainThread "))


#: The stall here lasts 8 data timeouts, not the runtime's 20: the stacks are taken 0.5 s into
#: the hang, rank 0 rejects after a data and a control timeout (1 + 3 s), and rank 1 still wakes
#: twice that long after it stalled. The other 12 s were spent waiting on a sleeping rank.
STALL_DATA_TIMEOUTS = 8


def _run_drill_with_a_shorter_stall(rank: int, world_size: int, drill: Drill) -> dict:
    from accelpact.faults import inject

    inject.STALL_FACTOR = STALL_DATA_TIMEOUTS  # in this rank's process only
    return run_drill(rank, world_size, drill)


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_a_stalled_rank_and_its_waiting_peer_leave_the_stacks_of_the_hang(tmp_path, capsys):
    """Rank 1 stalls in the forward of update 2 (8 data timeouts); rank 0 waits in the collective
    of DDP's forward (its bucket rebuild in the second iteration) until the data timeout, then in
    the boundary check until the control timeout: it rejects. Rank 1 wakes long after and rejects
    too. Both records were written by recovery code (evidence_of), yet their hang stacks show the
    stall and the collective."""
    trace = tmp_path / "trace"
    drill = Drill(framework="ddp", local=1, layers=1, updates=3, faults="stall@2:forward:1", data_timeout_s=1.0,
                  control_timeout_s=3.0, reference=False, trace_dir=str(trace))
    results = run_world(_run_drill_with_a_shorter_stall, 2, drill, timeout_s=120, pg_timeout_s=60)
    assert all(r["rejected"] for r in results), results  # without spares a stall this long is a reject

    stalled = next(e for e in _incidents(trace, 1) if e["update"] == 2)["hang_stacks"]
    assert stalled is not None and (stalled["update"], stalled["phase"]) == (2, "forward")
    assert 0.5 <= stalled["phase_ran_s"] < 1.5 and stalled["threshold_s"] == 0.5
    main = _main_thread(stalled)
    assert "inject.py" in main[-1] and "in perform" in main[-1] and "sleep" in main[-1], main
    assert not any("evidence_of" in f or "_reject" in f for f in main), main  # not the recovery code

    waited = next(e for e in _incidents(trace, 0) if e["update"] == 2)["hang_stacks"]
    assert waited is not None and (waited["update"], waited["phase"]) == (2, "forward")
    main = _main_thread(waited)
    assert "parallel/distributed.py" in main[-1] and "_rebuild_buckets" in main[-1], main  # DDP's broadcast
    assert not any("_reject" in f or "evidence_of" in f for f in main), main
    assert not any(name.startswith("accelpact-hang-watch") for name in waited["stacks"])  # not itself

    from accelpact import cli

    capsys.readouterr()
    assert cli.main(["report", str(trace), "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "rank 1 during the hang: 0." in text and "s into forward of update 2" in text, text
    assert "faults/inject.py" in text and "rank 0 during the hang: " in text, text


def test_a_deferred_commit_keeps_the_stacks_of_the_update_past_it_for_its_evidence():
    """Found by review: with deferred boundaries the pending commit of update N runs when update
    N+1 has already hung, and its `on_commit` threw the stacks of N+1 away; a joined deferred
    recovery also names N, not N+1. The stacks of N+1 now survive the commit of N and are the
    evidence of a recovery that names N (or N+1); a commit of N+1 itself ends them."""
    watch = HangWatch(0.05, stacks=lambda: {"MainThread (1)": ["in the hang"]})
    watch.start()
    try:
        watch.arm(6, "forward")
        time.sleep(0.3)  # update 6 hangs: its stacks are taken
        watch.on_commit(5, 0)  # the deferred boundary of update 5 commits only now
        taken = watch.take(6)
        assert taken is not None and taken.update == 6
        watch.arm(8, "forward")
        time.sleep(0.3)
        assert watch.take(7, also_next=True) is not None  # a joined recovery names the boundary's update
        watch.arm(9, "backward")
        time.sleep(0.3)
        watch.on_commit(9, 0)
        assert watch.take(9) is None  # committed: no hang to report
    finally:
        watch.close()
