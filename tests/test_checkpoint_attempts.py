"""Restart attempts log and restart budget."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from accelpact.checkpoint import (
    AttemptLog,
    Refusal,
    RestartBudgetExceeded,
    RestoreResult,
    check_restart_budget,
    restart_count,
    updates_replayed,
)

pytestmark = pytest.mark.timeout(30)


def report(step: int) -> RestoreResult:
    return RestoreResult(step=step, path=f"/ck/step-{step}", frontier=step, opt_step=step, saved_attempt="0",
                      refused=(Refusal("step-9", "sha256 mismatch"),), latest_note=None, bytes=10, seconds=0.25,
                      verify_seconds=0.1)


def test_restart_count_comes_from_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert restart_count() == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert restart_count() == 2
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT='x' is not an integer"):
        restart_count({"TORCHELASTIC_RESTART_COUNT": "x"})
    assert updates_replayed(135, 100) == 35 and updates_replayed(None, 100) is None


def test_attempts_are_appended_durably_and_replay_is_derived(tmp_path: Path) -> None:
    first = AttemptLog(tmp_path, run_id="r1", attempt=0)
    first.record_fresh_start()
    first.record_fail_stop(frontier=135, reason="NCCL timeout in backward (phase=backward)")
    second = AttemptLog(tmp_path, run_id="r1", attempt=1)
    rec = second.record_restore(report(100))
    assert rec.updates_replayed == 35 and rec.checkpoint_step == 100 and rec.restore_seconds == 0.25
    assert rec.refused == ({"candidate": "step-9", "reason": "sha256 mismatch"},)
    AttemptLog(tmp_path, run_id="other", attempt=0).record_fresh_start()

    lines = (tmp_path / "attempts.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)["run_id"] in ("r1", "other") for line in lines)
    assert [r.event for r in second.records()] == ["fresh_start", "fail_stop", "restored"]
    assert len(second.records(all_runs=True)) == 4
    with (tmp_path / "attempts.jsonl").open("a") as f:
        f.write('{"run_id": "r1", "attem')  # a torn last line (crash mid-append) is skipped
    assert second.fail_stops() == 1 and second.last_failure_frontier() == 135
    # the next record starts on a line of its own: found by review, it was glued onto the fragment
    # and skipped with it, so a fail-stop after a torn append was never counted
    second.record_fail_stop(frontier=150, reason="after a torn line")
    assert second.fail_stops() == 2 and second.last_failure_frontier() == 150


def test_a_short_write_is_finished_not_dropped(tmp_path: Path, monkeypatch) -> None:
    """os.write may write part of a record (a nearly full disk): the rest follows, or OSError."""
    from accelpact.checkpoint import fsio

    real = fsio.os.write
    monkeypatch.setattr(fsio.os, "write", lambda fd, data: real(fd, bytes(data[:5])))  # 5 bytes at a time
    log = AttemptLog(tmp_path, run_id="r1", attempt=0)
    log.record_fail_stop(frontier=7, reason="short writes")
    log.record_fail_stop(frontier=9, reason="short writes")
    assert log.fail_stops() == 2 and log.last_failure_frontier() == 9


def test_restart_budget_stops_after_too_many_restarts(tmp_path: Path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="accelpact.checkpoint")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert check_restart_budget(3) == 3
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "4")
    with pytest.raises(RestartBudgetExceeded, match=r"4 restarts used .* > max_restarts=3"):
        check_restart_budget(3)
    # A resubmitted job restarts torchrun's counter; the recorded fail-stops still count.
    log = AttemptLog(tmp_path, run_id="r1", attempt=0)
    for frontier in (10, 20, 30):
        log.record_fail_stop(frontier=frontier, reason="injected")
    assert check_restart_budget(3, attempt=0, log=log) == 3
    log.record_fail_stop(frontier=40, reason="injected")
    with pytest.raises(RestartBudgetExceeded, match="run 'r1'.*4 fail-stops recorded"):
        check_restart_budget(3, attempt=0, log=log)
    assert any(getattr(r, "event", "") == "checkpoint.restart_budget_exceeded" for r in caplog.records)
    with pytest.raises(ValueError, match="max_restarts"):
        check_restart_budget(-1)


def test_a_run_launched_again_is_the_run_that_wrote_its_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """`torchrun --standalone` draws a new TORCHELASTIC_RUN_ID at every launch: taken as the run
    id, a requeued job refused every step it had written and could neither resume nor start."""
    from accelpact.checkpoint.manifest import FileEntry, Manifest
    from accelpact.checkpoint.naming import MANIFEST_NAME, step_dir_name
    from accelpact.checkpoint.selection import recorded_run
    from accelpact.runtime.checkpointing import run_identity

    def publish(step: int, run: str, manifest: bytes | None = None) -> None:
        d = tmp_path / step_dir_name(step)
        d.mkdir()
        m = Manifest(run_id=run, attempt="0", step=step, world_size=1, layout="x", torch_version="t",
                     files=(FileEntry("shards/a", 1, "0" * 64),), created_at="now", frontier=step, opt_step=step)
        (d / MANIFEST_NAME).write_bytes(manifest if manifest is not None else m.to_json().encode())

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-2")
    assert recorded_run(tmp_path) is None and run_identity(None, str(tmp_path)) == "launch-2"  # a fresh root
    publish(3, "launch-1")
    publish(5, "launch-1", manifest=b"{torn")  # the newest unreadable: the next one says whose they are
    assert recorded_run(tmp_path) == "launch-1"
    assert run_identity(None, str(tmp_path)) == "launch-1"
    assert run_identity("given", str(tmp_path)) == "given"  # a given id still refuses another run's steps
    assert recorded_run(tmp_path / "missing") is None


def test_launches_that_crash_before_the_first_checkpoint_are_one_run(tmp_path: Path, monkeypatch) -> None:
    """Found by review: with no step published, each `--standalone` launch took its new
    TORCHELASTIC_RUN_ID for the run, read the previous launches' lines as another run's, and a
    crash loop before the first checkpoint never spent the budget. The attempts log says whose
    root it is until a step does."""
    from accelpact.checkpoint.attempts import ATTEMPTS_NAME, last_recorded_run
    from accelpact.runtime.checkpointing import run_identity

    assert last_recorded_run(tmp_path) is None
    for n in range(3):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"rdzv-{n}")
        run = run_identity(None, str(tmp_path))
        assert run == "rdzv-0"  # the first launch's, every time
        log = AttemptLog(tmp_path, run_id=run, attempt=0, launch=f"L{n}")
        assert (log.note_unrecorded_end() is None) == (n == 0)  # the previous launch's crash, on record
        assert log.failures_of_other_launches() == n
        log.record_started()
        log.record_fresh_start()  # and then it crashed before saving step 1
    (tmp_path / ATTEMPTS_NAME).open("a").write("{torn\n")
    assert last_recorded_run(tmp_path) == "rdzv-0"  # a torn last line is skipped
    assert run_identity("given", str(tmp_path)) == "given"
    # every rank asks before a collective: an unreadable log names no run, it never raises on one
    real = Path.read_bytes

    def unreadable(path):
        if path.name == ATTEMPTS_NAME:
            raise OSError(5, "Input/output error")
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    assert last_recorded_run(tmp_path) is None and run_identity(None, str(tmp_path)) == "rdzv-2"


@pytest.mark.parametrize(("rank", "local_rank", "stops"), [(0, "0", True), (4, "0", True), (5, "1", False),
                                                           (0, None, True), (3, None, False)])
def test_a_spent_budget_stops_every_nodes_agent_once(monkeypatch, rank, local_rank, stops):
    """Found by review: only global rank 0 stopped its agent; the other nodes' agents restarted their
    workers and waited out the rendezvous."""
    import signal

    from accelpact.runtime import fail_stop as edge

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    killed, exited = [], []
    monkeypatch.setattr(edge.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setattr(edge.os, "_exit", lambda code: exited.append(code))
    edge.fail_stop(RestartBudgetExceeded("4 restarts used > max_restarts=3"), on_reject="exit", rank=rank)
    assert killed == ([signal.SIGTERM] if stops else []) and exited == [76]


def test_how_the_previous_attempt_ended_is_recorded_before_the_budget_stops_the_job(monkeypatch):
    """Found by review: the budget was enforced first, so the attempt that spent it was never logged."""
    import importlib
    from types import SimpleNamespace

    attach_module = importlib.import_module("accelpact.runtime.attach")
    checkpointing = importlib.import_module("accelpact.runtime.checkpointing")
    calls = []

    class Checkpointer:
        def __init__(self, rt):
            pass

        def note_previous_attempt(self):
            calls.append("noted")

        def enforce_budget(self):
            calls.append("enforced")
            raise RestartBudgetExceeded("4 restarts used > max_restarts=3")

    monkeypatch.setattr(checkpointing, "Checkpointer", Checkpointer)
    monkeypatch.setattr(attach_module, "fail_stop", lambda exc, **kw: calls.append("stopped"))
    config = SimpleNamespace(checkpoint_dir="/ckpt", on_reject="exit", restore=False)
    attach_module._checkpointing(SimpleNamespace(membership=None), config, rank=0)
    assert calls == ["noted", "enforced", "stopped"]
