"""The fail-stop is on record before any rank exits, and an attempt that died without one is
recorded as such by the next: torchrun stops every worker as soon as the first exits, so a rank 0
slower than its peers lost its record (seen in CI: a restarted attempt died and the log showed
it as clean)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from accelpact.checkpoint import AttemptLog, RestoreResult
from accelpact.checkpoint.attempts import ENDED_UNRECORDED, FAIL_STOP, RESTORED, AttemptRecord
from accelpact.control.plane import ControlPlane
from accelpact.errors import ControlPlaneError
from accelpact.runtime import checkpointing
from accelpact.runtime.checkpointing import FAIL_STOP_RECORDED, Checkpointer

pytestmark = pytest.mark.timeout(30)


def report(step: int) -> RestoreResult:
    return RestoreResult(step=step, path=f"/ck/step-{step}", frontier=step, opt_step=step, saved_attempt="0",
                         refused=(), latest_note=None, bytes=10, seconds=0.25, verify_seconds=0.1)


def _plane(store: dist.Store, timeout_s: float = 6.0) -> ControlPlane:
    """A control plane's store side only (mark/await_mark), on an in-process store."""
    plane = ControlPlane.__new__(ControlPlane)
    plane.store, plane.timeout_s = store, timeout_s
    return plane


def _checkpointer(rank: int, control: ControlPlane, attempts: AttemptLog) -> Checkpointer:
    ck = Checkpointer.__new__(Checkpointer)
    ck.rt, ck.attempts = SimpleNamespace(rank=rank, control=control), attempts
    return ck


class _SlowLog(AttemptLog):
    """Rank 0's disk is slow: the record lands `delay_s` after the call."""

    def __init__(self, root: Path, delay_s: float, done: list) -> None:
        super().__init__(root, run_id="job", attempt=1)
        self.delay_s, self.done = delay_s, done

    def record_fail_stop(self, frontier: int, reason: str) -> AttemptRecord:
        time.sleep(self.delay_s)
        rec = super().record_fail_stop(frontier, reason)
        self.done.append(("recorded", time.monotonic()))
        return rec


def test_the_other_ranks_leave_only_after_rank_0_recorded_the_fail_stop(tmp_path: Path) -> None:
    store, events = dist.HashStore(), []
    rank0 = _checkpointer(0, _plane(store), _SlowLog(tmp_path, 0.5, events))
    rank1 = _checkpointer(1, _plane(store), AttemptLog(tmp_path, run_id="job", attempt=1))

    def leave_as_rank1() -> None:
        rank1.record_fail_stop(7, ["skipped collective"])
        events.append(("rank 1 exits", time.monotonic()))

    t = threading.Thread(target=leave_as_rank1)
    t.start()  # rank 1 reaches its exit first ...
    time.sleep(0.1)
    rank0.record_fail_stop(7, ["skipped collective"])  # ... rank 0 is slow to write
    t.join(10)
    assert [name for name, _ in sorted(events, key=lambda e: e[1])] == ["recorded", "rank 1 exits"]
    (rec,) = AttemptLog(tmp_path, run_id="job").records()
    assert (rec.attempt, rec.event, rec.frontier) == (1, FAIL_STOP, 7)


def test_without_rank_0_the_others_wait_only_their_bound(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checkpointing, "FAIL_STOP_WAIT_S", 0.3)
    rank1 = _checkpointer(1, _plane(dist.HashStore()), AttemptLog(tmp_path, run_id="job", attempt=1))
    t0 = time.monotonic()
    rank1.record_fail_stop(7, ["rank 0 lost"])  # nobody marks: rank 0 is the rank that is gone
    assert 0.25 <= time.monotonic() - t0 < 3
    assert not (tmp_path / "attempts.jsonl").exists()  # only rank 0 writes the log


def test_a_full_disk_on_rank_0_still_releases_the_others(tmp_path: Path) -> None:
    class FullDisk(AttemptLog):
        def record_fail_stop(self, frontier: int, reason: str) -> AttemptRecord:
            raise OSError(28, "No space left on device")

    store = dist.HashStore()
    _checkpointer(0, _plane(store), FullDisk(tmp_path, run_id="job", attempt=0)).record_fail_stop(3, ["x"])
    assert _plane(store).await_mark(FAIL_STOP_RECORDED, 0.1)


def test_a_store_gone_is_a_control_plane_error_for_mark_and_false_for_await() -> None:
    class Gone:
        def set(self, *a):
            raise RuntimeError("Connection reset by peer")

        def wait(self, *a):
            raise RuntimeError("Connection reset by peer")

    with pytest.raises(ControlPlaneError, match="marking 'x' failed: RuntimeError: Connection reset"):
        _plane(Gone()).mark("x")
    assert _plane(Gone()).await_mark("x", 0.1) is False


def test_the_next_attempt_records_one_that_ended_without_its_fail_stop(tmp_path: Path) -> None:
    first = AttemptLog(tmp_path, run_id="job", attempt=0)
    first.record_fail_stop(5, "backward timeout")
    assert AttemptLog(tmp_path, run_id="job", attempt=1).note_unrecorded_end() is None  # 0 is on record
    AttemptLog(tmp_path, run_id="job", attempt=1).record_restore(report(3))
    third = AttemptLog(tmp_path, run_id="job", attempt=2)
    assert third.last_failure_frontier() == 5
    rec = third.note_unrecorded_end()  # attempt 1 restored, then died with no fail-stop
    assert rec is not None and (rec.attempt, rec.event, rec.frontier) == (1, ENDED_UNRECORDED, None)
    assert "attempt 1 ended without a fail-stop record" in rec.reason
    assert third.last_failure_frontier() is None  # what attempt 1 reached is not known
    assert third.record_restore(report(6)).updates_replayed is None  # so the replay is not claimed
    assert third.fail_stops() == 1  # torchrun's attempt number counts the lost one for the budget
    assert [(r.attempt, r.event) for r in third.records()] == [
        (0, FAIL_STOP), (1, RESTORED), (1, ENDED_UNRECORDED), (2, RESTORED)]
    assert AttemptLog(tmp_path, run_id="job", attempt=0).note_unrecorded_end() is None  # a first attempt


def test_an_earlier_launchs_fail_stop_does_not_hide_this_launchs_crash(tmp_path):
    """Attempts count from 0 again in every launch of a run: found by review, the first launch's
    attempt-0 fail-stop made the second launch's attempt-0 crash look recorded."""
    AttemptLog(tmp_path, run_id="job", attempt=0, launch="first").record_fail_stop(5, "rejected")
    rec = AttemptLog(tmp_path, run_id="job", attempt=1, launch="second").note_unrecorded_end()
    assert rec is not None and rec.attempt == 0 and rec.launch == "second"
    assert AttemptLog(tmp_path, run_id="job", attempt=1, launch="first").note_unrecorded_end() is None


def test_every_worker_of_a_launch_reads_one_launch_id_and_the_next_launch_draws_another():
    import threading

    import torch.distributed as dist

    from accelpact.launch import launch_id

    store, got = dist.HashStore(), {}
    followers = [threading.Thread(target=lambda r=r: got.setdefault(r, launch_id(store, "p/", r))) for r in (1, 2)]
    for t in followers:
        t.start()
    got[0] = launch_id(store, "p/", 0)
    for t in followers:
        t.join(10)
    assert len(set(got.values())) == 1 and launch_id(store, "p/", 0) == got[0]  # a later attempt: the same
    assert launch_id(dist.HashStore(), "p/", 0) != got[0]  # a new launch (a new launcher store)


# -- a launch that ended without a word, counted by the next launch (the spares recipe relaunches) --

def test_a_launchs_first_attempt_records_the_previous_launch_that_ended_without_an_end_line(tmp_path):
    """Under the spares recipe every launch is attempt 0, so only the next launch can notice that
    one crashed; found by review: such a crash loop was never counted against the budget."""
    crashed = AttemptLog(tmp_path, run_id="job", attempt=0, launch="A")
    crashed.record_started()
    crashed.record_restore(report(3))
    nxt = AttemptLog(tmp_path, run_id="job", attempt=0, launch="B")
    rec = nxt.note_unrecorded_end()
    assert rec is not None and (rec.attempt, rec.event, rec.launch) == (0, ENDED_UNRECORDED, "A")
    assert "launch A ended at attempt 0 without a fail-stop or a finish record" in rec.reason
    assert nxt.note_unrecorded_end() is None  # on record once: the next look finds the end line
    assert nxt.failures_of_other_launches() == 1


@pytest.mark.parametrize("end", ["fail_stop", "finished", "none_written_outside_torchrun"])
def test_a_previous_launch_that_ended_on_record_or_cannot_be_told_apart_is_not_noted(tmp_path, end):
    before = AttemptLog(tmp_path, run_id="job", attempt=0, launch=None if end.startswith("none") else "A")
    before.record_started()
    if end == "fail_stop":
        before.record_fail_stop(4, "rejected")
    elif end == "finished":
        before.record_finished(9)
    assert AttemptLog(tmp_path, run_id="job", attempt=0, launch="B").note_unrecorded_end() is None
    # nor does a launch note itself (its own restart does, by attempt number)
    assert AttemptLog(tmp_path, run_id="job", attempt=0, launch=before.launch).note_unrecorded_end() is None


def test_a_crash_loop_of_relaunches_spends_the_budget(tmp_path):
    """Three launches that each crashed (no fail-stop), then a fourth: 3 restarts used > 2. Under
    the old rule, max(attempt 0, 0 fail-stops) = 0, the loop never ended."""
    from accelpact.checkpoint.attempts import check_restart_budget
    from accelpact.checkpoint.errors import RestartBudgetExceeded

    for n, launch in enumerate("ABCD"):
        log = AttemptLog(tmp_path, run_id="job", attempt=0, launch=launch)
        log.note_unrecorded_end()
        if n < 3:
            assert check_restart_budget(2, attempt=0, log=log) == n
            log.record_started()  # and crashed
    with pytest.raises(RestartBudgetExceeded, match=r"3 restarts used .*3 failed attempts of earlier launches"):
        check_restart_budget(2, attempt=0, log=log)
    # this launch's own restarts add to the others' failures (torchrun's number counts its own)
    assert check_restart_budget(9, attempt=2, log=AttemptLog(tmp_path, run_id="job", attempt=2, launch="D")) == 5
    # a finished launch costs a resubmission nothing
    AttemptLog(tmp_path, run_id="job", attempt=0, launch="D").record_finished(12)
    fresh = AttemptLog(tmp_path, run_id="job", attempt=0, launch="E")
    assert fresh.note_unrecorded_end() is None and check_restart_budget(9, attempt=0, log=fresh) == 3


def test_the_end_of_training_is_recorded_once_and_never_for_a_failure(tmp_path, monkeypatch):
    """`Checkpointer.record_finished` (called from `rt.close()`): rank 0 only, once, and not while
    an exception is in flight (a close in the script's `finally`, a failed attach) or after a
    reject, so the next launch still counts those as failures."""
    from accelpact.checkpoint.attempts import FINISHED
    from accelpact.fsm.phases import RecoveryAction

    def finisher(rank, history=()):
        ck = Checkpointer.__new__(Checkpointer)
        ck.rt = SimpleNamespace(rank=rank, frontier=7, history=list(history))
        ck.attempts, ck.finished = AttemptLog(tmp_path, run_id="job", attempt=0, launch="A"), False
        return ck

    def finished_lines():
        return [(r.event, r.frontier) for r in AttemptLog(tmp_path, run_id="job").records() if r.event == FINISHED]

    finisher(1).record_finished()
    assert finished_lines() == []  # only rank 0 writes the log
    try:
        raise RuntimeError("the script's own failure")
    except RuntimeError:
        finisher(0).record_finished()  # a close inside `except` / `finally`
    assert finished_lines() == []
    finisher(0, [SimpleNamespace(action=RecoveryAction.REJECT)]).record_finished()
    assert finished_lines() == []
    fenced = finisher(0)
    fenced.rt.membership = SimpleNamespace(finished=True)  # RankFenced / RankLeft caught by the script
    fenced.record_finished()
    assert finished_lines() == []
    ck = finisher(0, [SimpleNamespace(action=RecoveryAction.PRESERVE)])
    ck.record_finished()
    ck.record_finished()  # a second close
    assert finished_lines() == [("finished", 7)]


def test_every_rank_follows_rank_0s_budget_verdict(tmp_path):
    """Rank 0 notes how the previous launch ended, then counts; the others must not count from a log
    read before that note landed (found by review: rank 1 passed with 1 restart used where rank 0
    stopped at 2, and went on into the restore without it)."""
    from accelpact.errors import RestartBudgetExceeded

    AttemptLog(tmp_path, run_id="job", attempt=0, launch="A").record_started()  # launch A crashed
    gathered = []

    def checkpointer(rank: int, rank0_used: float) -> Checkpointer:
        ck = Checkpointer.__new__(Checkpointer)
        control = SimpleNamespace(gather_floats=lambda values: gathered.append((rank, values)) or [(rank0_used,), (-1.0,)])
        ck.rt = SimpleNamespace(rank=rank, attempt=0, control=control, config=SimpleNamespace(max_restarts=0))
        ck.attempts = AttemptLog(tmp_path, run_id="job", attempt=0, launch="B")
        return ck

    follower = checkpointer(1, rank0_used=1.0)  # its own read of the log (no note yet) says 0 used
    with pytest.raises(RestartBudgetExceeded, match="rank 0 counted 1 restarts used > max_restarts=0"):
        follower.enforce_budget()
    leader = checkpointer(0, rank0_used=1.0)
    leader.note_previous_attempt()
    with pytest.raises(RestartBudgetExceeded, match=r"1 restarts used .*1 failed attempts of earlier launches"):
        leader.enforce_budget()
    assert gathered == [(1, [-1.0]), (0, [1.0])]  # each posted what it found; rank 0's count decides
    fine = checkpointer(1, rank0_used=-1.0)
    fine.rt.config.max_restarts = 5
    fine.enforce_budget()  # within the budget everywhere: nothing raised, rank 1 writes no start


def test_rank_0_that_cannot_read_or_write_the_log_still_reaches_its_peers(tmp_path, monkeypatch, caplog):
    """Found by review: an unreadable attempts log (EIO) raised on rank 0 before the verdict's
    gather, and a full disk raised in `record_restore` / `record_fresh_start` on rank 0 alone after
    the restore's last collective: either way its peers waited out the control timeout, at every
    restart. Now rank 0 counts this launch's attempts only, and a failed write is logged."""
    import errno

    from accelpact.errors import RestartBudgetExceeded

    gathered = []
    ck = Checkpointer.__new__(Checkpointer)
    control = SimpleNamespace(gather_floats=lambda values: gathered.append(values) or [tuple(values)])
    ck.rt = SimpleNamespace(rank=0, attempt=1, control=control, config=SimpleNamespace(max_restarts=0))
    ck.attempts = AttemptLog(tmp_path, run_id="job", attempt=1, launch="B")

    def unreadable(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(AttemptLog, "records", unreadable)
    with caplog.at_level("ERROR", logger="accelpact.checkpointing"):
        with pytest.raises(RestartBudgetExceeded, match=r"1 restarts used \(attempt 1"):
            ck._budget_verdict_of_rank_0()  # attempt 1 > 0 still stops it, after the gather
    assert gathered == [[1.0]] and "counting this launch's attempts only" in caplog.text

    monkeypatch.setattr(AttemptLog, "append", lambda self, record: unreadable())
    report = RestoreResult(step=8, path="/ck/step-8", frontier=8, opt_step=8, saved_attempt="0", refused=(),
                           latest_note=None, bytes=1, seconds=0.1, verify_seconds=0.0)
    ck.rt = SimpleNamespace(rank=0, attempt=0, frontier=0, opt_step=0, update_index=0, model=None, optimizer=None,
                            control=SimpleNamespace(timeout_s=1.0, timeout_for=lambda s: contextlib.nullcontext()))
    ck.app_state = lambda: None
    for loaded in (report, None):
        ck.manager = SimpleNamespace(load_latest=lambda **kw: loaded)  # noqa: B023
        caplog.clear()
        with caplog.at_level("ERROR", logger="accelpact.checkpointing"):
            assert ck.restore() is loaded
        assert "could not write to" in caplog.text and "Input/output error" in caplog.text


def test_a_chain_of_preempted_launches_that_each_saved_a_newer_step_spends_nothing(tmp_path):
    """A launch the scheduler stopped (wall-clock limit, preemption: no fail-stop, no close) after it
    saved past the step it started from made progress: noted, not counted. Found by review: four
    healthy requeues stopped the fifth under the default budget. One that saved nothing new still
    counts (a crash loop)."""
    from accelpact.checkpoint.attempts import ENDED_AFTER_PROGRESS, check_restart_budget

    saved: dict[str, int] = {}  # launch -> the newest step its manifests name it for
    newest = 0
    for n, launch in enumerate("ABCD"):
        log = AttemptLog(tmp_path, run_id="job", attempt=0, launch=launch)
        rec = log.note_unrecorded_end(saved_by=saved.get)
        assert (rec is None) if n == 0 else (rec.event == ENDED_AFTER_PROGRESS and rec.checkpoint_step == newest)
        assert check_restart_budget(0, attempt=0, log=log) == 0  # no restart spent, even with a budget of 0
        log.record_started()
        if n == 0:
            log.record_fresh_start()
        else:
            log.record_restore(report(newest))
        newest += 1000  # it saved a newer step, then was stopped without a word
        saved[launch] = newest
    stuck = AttemptLog(tmp_path, run_id="job", attempt=0, launch="E")
    assert stuck.note_unrecorded_end(saved_by=saved.get).event == ENDED_AFTER_PROGRESS  # D saved 4000
    stuck.record_started()
    stuck.record_restore(report(newest))  # E restores 4000 and dies before saving anything newer
    rec = AttemptLog(tmp_path, run_id="job", attempt=0, launch="F").note_unrecorded_end(saved_by=saved.get)
    assert rec.event == ENDED_UNRECORDED and rec.launch == "E"
    assert AttemptLog(tmp_path, run_id="job", attempt=0, launch="F").failures_of_other_launches() == 1


def test_a_newer_step_the_launch_refused_is_not_its_progress(tmp_path):
    """Found by review: step 12 is corrupt, launch A refuses it, restores 8 and crashes before it
    saves anything. Judged by names, step 12 was newer than A's start, so every launch of the loop
    was noted as progress and the budget never moved. Judged by who saved it (the manifest's
    launch), A saved nothing: its end is a failure."""
    from accelpact.checkpoint.attempts import check_restart_budget
    from accelpact.errors import RestartBudgetExceeded

    saved = {"before": 12}  # an earlier launch wrote step 12 (the one that is now corrupt)
    for launch, next_launch in (("A", "B"), ("B", "C"), ("C", "D")):
        log = AttemptLog(tmp_path, run_id="job", attempt=0, launch=launch)
        log.record_started()
        log.record_restore(report(8))
        rec = AttemptLog(tmp_path, run_id="job", attempt=0, launch=next_launch).note_unrecorded_end(saved_by=saved.get)
        assert rec.event == ENDED_UNRECORDED and rec.launch == launch
    with pytest.raises(RestartBudgetExceeded, match="3 restarts used"):
        check_restart_budget(2, attempt=0, log=AttemptLog(tmp_path, run_id="job", attempt=0, launch="D"))


def test_the_launch_that_saved_a_step_is_read_from_its_manifest(tmp_path):
    """`Checkpointer.saved_by`: the newest step whose manifest names the launch; a torn manifest
    is nobody's."""
    from accelpact.checkpoint.manifest import FileEntry, Manifest
    from accelpact.checkpoint.naming import MANIFEST_NAME, step_dir_name
    from accelpact.runtime.checkpointing import Checkpointer

    def publish(step: int, launch: str | None) -> None:
        d = tmp_path / step_dir_name(step)
        d.mkdir()
        m = Manifest(run_id="job", attempt="0", step=step, world_size=1, layout="l", torch_version="x",
                     files=(FileEntry("a.distcp", 1, "0" * 64),),
                     created_at="t", frontier=step, opt_step=step, extra={"launch": launch})
        (d / MANIFEST_NAME).write_text(m.to_json())

    publish(4, "A")
    publish(8, "B")
    publish(12, "A")
    (tmp_path / step_dir_name(16)).mkdir()
    (tmp_path / step_dir_name(16) / MANIFEST_NAME).write_text('{"torn')
    cp = Checkpointer.__new__(Checkpointer)
    cp.attempts = AttemptLog(tmp_path, run_id="job", attempt=0)
    assert (cp.saved_by("A"), cp.saved_by("B"), cp.saved_by("C")) == (12, 8, None)
