"""The work after a commit (replica digests, the checkpoint save) runs on the control plane with
no detection before it, so a stalled link there is given what a cut at an update is given: the
data timeout plus the control timeout. Pure checks of the stretch and of the untouched hot path,
and a spawned world where one rank stalls in the save for longer than the control timeout: every
rank waits it out, saves, and ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelpact.checkpoint import CheckpointSaveError, agreed_failure
from accelpact.checkpoint.failed_saves import judge_failed_save
from accelpact.checkpoint.naming import TMP_MARK, step_dir_name
from accelpact.control.plane import ControlPlane
from accelpact.errors import ControlPlaneError
from accelpact.runtime import after_commit as after_commit_mod
from accelpact.runtime.checkpointing import Checkpointer
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world
from model_checking.trace_validation import assert_valid_run


class _Plane:
    """Just the timeout part of a ControlPlane: what `timeout_for` sets, in order."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s, self.set = timeout_s, []

    def set_timeout(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.set.append(timeout_s)

    timeout_for = ControlPlane.timeout_for


def test_timeout_for_restores_the_usual_timeout_after_a_failure_too() -> None:
    plane = _Plane(5.0)
    with plane.timeout_for(7.0):
        assert plane.timeout_s == 7.0
    assert plane.timeout_s == 5.0
    with pytest.raises(RuntimeError, match="the save failed"), plane.timeout_for(7.0):
        raise RuntimeError("the save failed")
    assert plane.set == [7.0, 5.0, 7.0, 5.0]


class _Due:
    def __init__(self, every: int, log: list) -> None:
        self.every, self.log = every, log

    def due(self, frontier: int) -> bool:
        return frontier % self.every == 0

    def after_commit(self, rt, *, owed: bool = False) -> None:
        if owed or self.due(rt.frontier):
            self.log.append((type(self).__name__, rt.frontier, rt.control.timeout_s))


class _Digests(_Due):
    def after_commit(self, rt, *, before_save: bool = False) -> None:
        if before_save or self.due(rt.frontier):
            self.log.append((type(self).__name__, rt.frontier, rt.control.timeout_s))


class _Attempts:
    def __init__(self) -> None:
        self.failed: list = []

    def record_save_failed(self, frontier: int, reason: str) -> None:
        self.failed.append((frontier, reason))


class _Checkpointer(_Due):
    """The runtime's judgement of a failed save (`Checkpointer.judge_failure`), on a stub."""

    judge_failure, newest_step, _record = Checkpointer.judge_failure, Checkpointer.newest_step, Checkpointer._record

    def __init__(self, every: int, log: list, rt: SimpleNamespace) -> None:
        super().__init__(every, log)
        self.rt, self.saves, self.failed, self.in_a_row, self.restored = rt, [], [], 0, None
        self.attempts = _Attempts()


def _runtime(frontier: int, log: list, tolerated: int = 3) -> SimpleNamespace:
    rt = SimpleNamespace(frontier=frontier, control=_Plane(5.0), digests=_Digests(3, log), listeners=[],
                         membership=None, rank=0,
                         config=SimpleNamespace(data_timeout_s=2.0, control_timeout_s=5.0,
                                                checkpoint_failures_tolerated=tolerated))
    rt.checkpointer = _Checkpointer(2, log, rt)
    return rt


def test_the_usual_update_leaves_the_control_timeout_alone() -> None:
    log: list = []
    rt = _runtime(1, log)  # neither a digest check nor a save is due at F=1
    after_commit_mod.after_commit(rt)
    assert log == [] and rt.control.set == []  # nothing set on the per-update path


def test_a_due_save_and_digest_check_get_data_plus_control_timeout() -> None:
    log: list = []
    rt = _runtime(6, log)  # both due at F=6
    after_commit_mod.after_commit(rt)
    assert log == [("_Digests", 6, 7.0), ("_Checkpointer", 6, 7.0)]  # digests first, then the save
    assert rt.control.set == [7.0, 5.0] and rt.control.timeout_s == 5.0


def test_with_digests_on_every_save_is_checked_first_even_between_checks() -> None:
    """Found by review: with digest_every=3 and a save every 2, the saves at F=2 and F=4 went
    unchecked; a bit flipped before F=2 could be what DCP wrote (it writes each shard from one
    holder), and the Reject of the check at F=3 restarted from exactly that step."""
    log: list = []
    rt = _runtime(2, log)
    after_commit_mod.after_commit(rt)
    assert log == [("_Digests", 2, 7.0), ("_Checkpointer", 2, 7.0)]
    rt = _runtime(2, log := [])
    rt.digests = None  # digests off: the save alone, as before
    after_commit_mod.after_commit(rt)
    assert log == [("_Checkpointer", 2, 7.0)]


def _failing_save(rt: SimpleNamespace, exc: BaseException) -> list:
    seen: list = []

    def fail(_rt, *, owed: bool = False) -> None:
        raise exc

    def reject(reason: str, error: BaseException) -> None:
        seen.append((reason, type(error).__name__, rt.control.timeout_s))

    rt.checkpointer.after_commit, rt._reject_without_protocol = fail, reject
    return seen


def test_a_save_whose_own_collective_failed_rejects_outside_the_stretch() -> None:
    rt = _runtime(2, [])
    seen = _failing_save(rt, RuntimeError("Connection closed by peer"))  # no agreement: ranks may differ
    after_commit_mod.after_commit(rt)
    ((reason, kind, timeout),) = seen
    assert reason.startswith("checkpoint save at F=2 failed: RuntimeError: Connection closed by peer [the save's own "
                             "collective failed") and kind == "RuntimeError" and timeout == 5.0
    assert rt.checkpointer.failed == [] and rt.checkpointer.attempts.failed == []


def test_a_save_that_failed_on_every_rank_alike_costs_that_checkpoint_up_to_the_tolerance() -> None:
    """Training goes on past `tolerated` failed saves in a row, recorded; one more fails stop; a
    save that publishes starts the count again."""
    rt = _runtime(2, [], tolerated=2)
    full = CheckpointSaveError("writing rank state for step 2 failed on 1 of 4 rank(s): rank 2: OSError: [Errno 28] "
                               "No space left on device", agreed=True)
    seen = _failing_save(rt, full)
    for frontier in (2, 4):
        rt.frontier = frontier
        after_commit_mod.after_commit(rt)
    assert seen == [] and [f["step"] for f in rt.checkpointer.failed] == [2, 4]
    assert [f for f, _ in rt.checkpointer.attempts.failed] == [2, 4]
    rt.frontier = 6
    after_commit_mod.after_commit(rt)
    ((reason, _, _),) = seen
    assert "[3 checkpoint save(s) in a row failed, more than checkpoint_failures_tolerated=2 (no checkpoint yet)]" \
        in reason, reason
    rt.checkpointer.in_a_row = 0  # a save published in between (Checkpointer.after_commit resets it)
    rt.checkpointer.saves.append({"step": 8})
    rt.frontier = 10
    after_commit_mod.after_commit(rt)
    assert len(seen) == 1 and rt.checkpointer.failed[-1]["step"] == 10


def test_under_membership_only_a_lost_peer_becomes_a_membership_change(monkeypatch) -> None:
    """A save whose own collective failed (a timeout, a closed connection) under spares goes to the
    membership change at phase committed; a storage error every rank agreed on, even one whose text
    says it timed out, is the save's own: past the tolerance it fails stop."""
    changes: list = []
    monkeypatch.setattr(after_commit_mod, "on_lost_member", lambda rt, exc, phase, detect_s: changes.append(
        (type(exc).__name__, str(phase))))
    lost = _runtime(2, [])
    lost.membership = object()
    seen = _failing_save(lost, RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    after_commit_mod.after_commit(lost)
    assert changes == [("RuntimeError", "committed")] and seen == []
    nfs = _runtime(2, [], tolerated=0)
    nfs.membership = object()
    seen = _failing_save(nfs, CheckpointSaveError("writing rank state failed on 1 of 4 rank(s): rank 1: "
                                                  "OSError: NFS server timed out", agreed=True))
    after_commit_mod.after_commit(nfs)
    assert len(changes) == 1 and len(seen) == 1 and "checkpoint_failures_tolerated=0" in seen[0][0]


class _Missing:
    """A listener whose control plane fails before the work after a commit (`miss@U:save:R`)."""

    def before_commit_work(self, update: int) -> None:
        raise ControlPlaneError(f"injected miss@{update}:save:1")


def test_a_save_lost_to_a_member_is_owed_and_the_owed_one_runs_without_the_fault_hook(monkeypatch) -> None:
    """A lost peer in the save of F marks F's save interrupted (this rank's presence tells the new
    world); the owed save, taken after the change, checks the replicas and saves, whether F is due
    or not, without the `before_commit_work` hook (its faults fired in the first pass). Found by
    review: it skipped the digest check, so a replica corrupted before a loss in the check's own
    gather could be what the owed checkpoint kept."""
    monkeypatch.setattr(after_commit_mod, "on_lost_member", lambda *a: None)
    rt = _runtime(2, [])
    rt.membership = object()
    rt.checkpointer.interrupted_at = None
    _failing_save(rt, RuntimeError("Connection closed by peer"))
    after_commit_mod.after_commit(rt)
    assert rt.checkpointer.interrupted_at == 2
    log: list = []
    rt = _runtime(3, log)  # F=3: neither a save nor a digest check is due
    rt.listeners = [SimpleNamespace(before_commit_work=lambda f: log.append(("hook", f)))]
    after_commit_mod.take_owed_save(rt)
    assert log == [("_Digests", 3, 7.0), ("_Checkpointer", 3, 7.0)] and rt.control.timeout_s == 5.0
    log.clear()
    digests, rt.digests = rt.digests, None  # digests off: the save alone
    after_commit_mod.take_owed_save(rt)
    assert log == [("_Checkpointer", 3, 7.0)]
    rt.digests = digests
    log.clear()
    rt.frontier = 6  # the usual path, both due: the hook first
    after_commit_mod.after_commit(rt)
    assert log == [("hook", 6), ("_Digests", 6, 7.0), ("_Checkpointer", 6, 7.0)]


def test_a_control_plane_that_fails_before_the_save_rejects_or_changes_membership(monkeypatch) -> None:
    changes: list = []
    monkeypatch.setattr(after_commit_mod, "on_lost_member", lambda rt, exc, phase, detect_s: changes.append(
        type(exc).__name__))
    alone = _runtime(2, [])
    alone.listeners = [_Missing()]
    seen = _failing_save(alone, AssertionError("the save must not start"))
    after_commit_mod.after_commit(alone)
    assert seen == [("the control plane failed after the commit of F=2: injected miss@2:save:1",
                     "ControlPlaneError", 5.0)] and changes == []
    spared = _runtime(2, [])
    spared.listeners, spared.membership = [_Missing()], object()
    seen = _failing_save(spared, AssertionError("the save must not start"))
    after_commit_mod.after_commit(spared)
    assert seen == [] and changes == ["ControlPlaneError"]


@pytest.mark.parametrize(("agreed", "in_a_row", "tolerated", "go_on"), [
    (True, 1, 3, True), (True, 3, 3, True), (True, 4, 3, False), (True, 1, 0, False), (False, 1, 3, False)])
def test_judge_failed_save(agreed: bool, in_a_row: int, tolerated: int, go_on: bool) -> None:
    verdict = judge_failed_save(agreed=agreed, in_a_row=in_a_row, tolerated=tolerated, last_saved=6)
    assert verdict.go_on is go_on
    assert ("the newest checkpoint stays step 6" in verdict.reason) is agreed


def test_only_errors_raised_after_an_agreement_are_agreed() -> None:
    assert agreed_failure(CheckpointSaveError("x", agreed=True))
    assert not agreed_failure(CheckpointSaveError("DCP save failed: Connection closed by peer"))
    assert not agreed_failure(RuntimeError("timed out"))


# ---------------------------------------------------------------- spawned world -----------------
STALL_S = 4.0  # longer than the control timeout (3 s), shorter than data + control (2 + 3 s)


def _stall_in_the_save(rank: int, world_size: int, drill: Drill, stalled: tuple[int, int]) -> dict:
    """Rank `stalled[1]` stops for STALL_S at the start of the save at F=`stalled[0]`, as a rank
    behind a cut link would look to its peers: they wait in the save's first collective."""
    from accelpact.runtime.checkpointing import Checkpointer

    save = Checkpointer.after_commit
    timeouts: list[float] = []

    def stalling(self: Checkpointer, rt, **kw) -> None:
        if self.due(rt.frontier):
            timeouts.append(rt.control.timeout_s)
            if (rt.frontier, rank) == stalled:
                time.sleep(STALL_S)
        save(self, rt, **kw)

    Checkpointer.after_commit = stalling
    out = run_drill(rank, world_size, drill)
    out["save_timeouts"] = timeouts
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_a_save_stalled_longer_than_the_control_timeout_is_waited_out_bitwise(tmp_path: Path) -> None:
    drill = Drill(framework="fsdp2", updates=6, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2,
                  data_timeout_s=2.0, control_timeout_s=3.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(_stall_in_the_save, 4, drill, (4, 1), timeout_s=180, pg_timeout_s=30)
    for r in results:
        assert r["rejected"] is None, r["rejected"]  # before the stretch: "checkpoint save at F=4 failed"
        assert r["frontier"] == 6 and r["history"] == []
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
        assert r["save_timeouts"] == [5.0, 5.0, 5.0], r["save_timeouts"]  # F=2, 4, 6
    published = sorted(p.name for p in (tmp_path / "ckpt").rglob("step-*") if p.is_dir())
    assert published == [step_dir_name(s) for s in (2, 4, 6)], published  # the stalled save published too
    assert_valid_run(tmp_path / "trace")


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_a_preserve_that_commits_a_save_due_update_saves_it(tmp_path: Path) -> None:
    """A skip at update 4's boundary is preserved, and the Preserve commits update 4 there. The save
    due at F=4 follows it as it follows a clean commit (it was skipped: steps 2 and 6 only)."""
    drill = Drill(framework="fsdp2", updates=6, faults="skip@4:committed:1", checkpoint_dir=str(tmp_path / "ckpt"),
                  checkpoint_every=2, data_timeout_s=1.0, control_timeout_s=4.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(run_drill, 4, drill, timeout_s=180, pg_timeout_s=30)
    for r in results:
        assert r["rejected"] is None, r["rejected"]
        assert [(h["action"], h["frontier"]) for h in r["history"]] == [("preserve", 4)], r["history"]
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
    published = sorted(p.name for p in (tmp_path / "ckpt").rglob("step-*") if p.is_dir())
    assert published == [step_dir_name(s) for s in (2, 4, 6)], published
    for trace in sorted((tmp_path / "trace").glob("trace-rank*.jsonl")):
        saves = [json.loads(line) for line in trace.read_text().splitlines() if '"checkpoint"' in line]
        assert [s["step"] for s in saves if s.get("kind") == "checkpoint"] == [2, 4, 6], trace.name
    assert_valid_run(tmp_path / "trace")


def _disk_full_on_rank_2(rank: int, world_size: int, drill: Drill, steps: tuple[int, ...]) -> dict:
    """Rank 2's write of its own state file fails (ENOSPC) in the saves of `steps`: every rank
    learns it from the save's agreement (`Comm.agree`), none publishes."""
    import errno

    from accelpact.checkpoint import manager

    write = manager.write_durable

    def full(path, data) -> None:
        if rank == 2 and any(f"step-{s:012d}" in str(path) for s in steps):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, data)

    manager.write_durable = full
    return run_drill(rank, world_size, drill)


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_saves_that_fail_on_every_rank_alike_cost_those_checkpoints_not_the_job(tmp_path: Path) -> None:
    """The saves of F=4 and F=8 fail (rank 2's disk is full); F=6's publishes between them. Each
    failure is agreed by every rank, so training goes on at F, recorded in attempts.jsonl, and
    ends bitwise equal to an uninterrupted run. (Each was a fail-stop to step 2, then 6: a
    restart into the same full disk.)"""
    ckpt = tmp_path / "ckpt"
    drill = Drill(framework="fsdp2", updates=8, checkpoint_dir=str(ckpt), checkpoint_every=2,
                  data_timeout_s=1.0, control_timeout_s=4.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(_disk_full_on_rank_2, 4, drill, (4, 8), timeout_s=180, pg_timeout_s=30)
    for r in results:
        assert r["rejected"] is None, r["rejected"]
        assert r["frontier"] == 8 and r["history"] == []
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
    published = sorted(p.name for p in ckpt.glob("step-*") if TMP_MARK not in p.name)
    assert published == [step_dir_name(2), step_dir_name(6)], published
    records = [json.loads(line) for line in (ckpt / "attempts.jsonl").read_text().splitlines()]
    failed = [(r["frontier"], r["reason"]) for r in records if r["event"] == "save_failed"]
    assert [f for f, _ in failed] == [4, 8], records
    assert all("rank 2: OSError: [Errno 28] No space left on device" in why for _, why in failed), failed
    assert not [r for r in records if r["event"] == "fail_stop"], records
    for trace in sorted((tmp_path / "trace").glob("trace-rank*.jsonl")):  # every rank traced each outcome
        saves = [json.loads(line) for line in trace.read_text().splitlines() if '"checkpoint"' in line]
        assert [(s["step"], "error" in s) for s in saves if s.get("kind") == "checkpoint"] == [
            (2, False), (4, True), (6, False), (8, True)], trace.name
    assert_valid_run(tmp_path / "trace")


class _Published:
    """A manager whose step is already published (rank 0 published it before a loss reached it)."""

    def save(self, step, **_):
        from accelpact.checkpoint import CheckpointExistsError

        raise CheckpointExistsError(f"step {step} is already published")

    problem: str | None = None  # it verifies: the owed save is done
    damaged = False

    def published_problem(self, step):
        return self.problem

    def set_aside_at_next_save(self, step):
        return self.damaged


def _saver(records: list) -> tuple[Checkpointer, SimpleNamespace]:
    ck = Checkpointer.__new__(Checkpointer)
    ck.every, ck.manager, ck.saves, ck.in_a_row = 2, _Published(), [], 1
    ck.rt = rt = SimpleNamespace(frontier=5, opt_step=5, data_state=None, model=None, optimizer=None,
                                 rewind=SimpleNamespace(stateful=()),
                                 control=SimpleNamespace(timeout_s=1.0, timeout_for=lambda s: contextlib.nullcontext()),
                                 trace=SimpleNamespace(write=records.append),
                                 observers=SimpleNamespace(checkpoint=lambda step, error: records.append(error)))
    return ck, rt


def test_an_owed_save_found_published_is_that_save_and_a_due_one_is_a_failure():
    """`take_owed_save` after a membership change: a step rank 0 published before the loss reached
    it is the save the new world owed (published saves are verified); on the usual schedule a
    step found published is a failed save, judged as one."""
    records: list = []
    ck, rt = _saver(records)
    ck.after_commit(rt, owed=True)  # F=5 is not due: owed saves run regardless
    assert records == [{"kind": "checkpoint", "step": 5, "seconds": records[0]["seconds"], "owed": True,
                        "published_before": True}] and ck.in_a_row == 0
    records.clear()
    ck.rt.frontier = rt.frontier = 6
    from accelpact.checkpoint import CheckpointExistsError

    with pytest.raises(CheckpointExistsError):
        ck.after_commit(rt)
    assert records[0]["error"].startswith("CheckpointExistsError: step 6") and records[1] == records[0]["error"]


def test_an_owed_save_over_a_step_that_cannot_be_relied_on_is_not_taken():
    """Found by review: step F present but refused for no damage (another run's, behind an I/O
    error) is not set aside, so the second save raised CheckpointExistsError again, and an owed
    save took that for "published before, and it verifies". It is a failed save, on every rank."""
    from accelpact.checkpoint import CheckpointSaveError, agreed_failure

    records: list = []
    ck, rt = _saver(records)
    ck.manager.problem = "written by run 'another-run'"
    with pytest.raises(CheckpointSaveError, match="left where it is and this save is not taken") as raised:
        ck.after_commit(rt, owed=True)
    assert agreed_failure(raised.value) and ck.in_a_row == 1  # judged like any save every rank failed
    assert "published_before" not in records[0] and "another-run" in records[0]["error"]


def test_a_restore_waits_for_its_collectives_the_restore_bound_not_the_control_timeout():
    """Each rank hashes its stripe of the chosen step and DCP reads it, at different speeds: the
    control timeout (seconds) failed any checkpoint past a few GB."""
    import contextlib
    from types import SimpleNamespace

    from accelpact.runtime import checkpointing

    bounds = []

    @contextlib.contextmanager
    def timeout_for(seconds):
        bounds.append(seconds)
        yield

    rt = SimpleNamespace(control=SimpleNamespace(timeout_s=6.0, timeout_for=timeout_for), rank=1, attempt=0,
                         frontier=0, opt_step=0, data_state=None, model=None, optimizer=None)
    ckpt = SimpleNamespace(rt=rt, app_state=lambda: None,
                           manager=SimpleNamespace(load_latest=lambda **kw: bounds.append("loaded")))
    assert Checkpointer.restore(ckpt) is None
    assert bounds == [checkpointing.RESTORE_TIMEOUT_S, "loaded"] and checkpointing.RESTORE_TIMEOUT_S >= 600
