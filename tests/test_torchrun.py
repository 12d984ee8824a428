"""The real fail-stop path under torchrun: a fault outside a committed boundary makes every rank
exit with EXIT_REJECTED and leave an evidence record; none resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import accelpact
from model_checking.trace_validation import assert_valid_run, read_run

pytestmark = pytest.mark.multiproc


def torchrun(args: list[str], timeout: float = 100, max_restarts: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           f"--max-restarts={max_restarts}", "-m", "accelpact.demo_worker", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True)


@pytest.mark.timeout(240)
def test_reject_exits_every_rank_then_restart_restore_replay_is_bitwise_equal_to_the_reference(tmp_path):
    """L1 then L2 end to end: backward fault → Reject → every rank of the attempt exits with
    EXIT_REJECTED and leaves an evidence record, none resumes → torchrun restart → newest verified
    checkpoint → replay from C to the failure → final state bitwise equal to an uninterrupted run.
    (One torchrun job for both: the rejected attempt 0 is the fail-stop path.)"""
    ckpt, result, trace = tmp_path / "ckpt", tmp_path / "result.json", tmp_path / "trace"
    # data timeout 2 s: the restarted attempt must not meet a spurious timeout of its own on a loaded
    # runner (one more attempt then; CI saw one with 1 s, its cause unrecorded at the time)
    proc = torchrun(["--updates=8", "--layers=2", "--faults=skip@6:backward:0", "--data-timeout=2",
                     "--control-timeout=6", f"--trace-dir={trace}", f"--checkpoint-dir={ckpt}",
                     "--checkpoint-every=3", f"--result={result}"], timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # attempt 0, the fail-stop path: torchrun saw a rank exit with EXIT_REJECTED ("failed
    # (exitcode: 75)" before it restarted the group), and every rank recorded why it exited so
    assert f"exitcode: {accelpact.EXIT_REJECTED}" in proc.stderr, proc.stderr[-3000:]
    attempt0 = read_run(trace)[0]
    assert sorted(attempt0) == [0, 1, 2, 3]
    for rank in range(4):
        evidence = json.loads((trace / f"reject-rank{rank}-attempt0.json").read_text())
        assert evidence["exit_code"] == accelpact.EXIT_REJECTED
        assert evidence["frontier"] == 5  # committed updates before the failed one; none after
        assert evidence["reasons"], evidence
        actions = [rec["action"] for _, rec in attempt0[rank].records if rec.get("kind") == "edge"]
        assert actions[-1] in ("decide_reject", "abort", "release_reject")
        assert "release" not in actions and "resume_training" not in actions
    summary = json.loads(result.read_text())
    assert summary["bitwise_ok"], summary
    attempts = [json.loads(x) for x in (ckpt / "attempts.jsonl").read_text().splitlines()]
    events = [(a["attempt"], a["event"]) for a in attempts]
    # a further attempt means the restored one died: its ranks' own words say why
    # each start and the script's own rt.close() on record too: the next launch counts no failure for it
    assert events == [(0, "started"), (0, "fresh_start"), (0, "fail_stop"), (1, "started"), (1, "restored"),
                      (1, "finished")], (events, proc.stderr[-6000:])
    fail_stop, restored, finished = attempts[2], attempts[4], attempts[5]
    assert fail_stop["frontier"] == 5 and restored["checkpoint_step"] == 3 and restored["updates_replayed"] == 2
    assert finished["frontier"] == 8
    assert_valid_run(tmp_path / "trace")  # both attempts: the rejected one and the restored one


@pytest.mark.timeout(300)
def test_restart_budget_stops_the_job_instead_of_looping(tmp_path):
    # A budget of one restart: attempt 0 fails, the restart (attempt 1) restores and fails again,
    # and attempt 2 finds the budget spent (two restarts used > 1) and stops. A budget of one
    # already needs the count carried across a restart (the fail-stops recorded and torchrun's
    # restart count); each more restart cost a whole torchrun attempt (~10 s of four fresh
    # interpreters) and tested nothing more.
    ckpt = tmp_path / "ckpt"
    proc = torchrun(["--updates=6", "--layers=2", "--faults=skip@4:backward:1", "--faults-every-attempt",
                     "--max-restarts=1", "--data-timeout=1", "--control-timeout=6", "--no-reference",
                     f"--checkpoint-dir={ckpt}", "--checkpoint-every=2"], timeout=280, max_restarts=6)
    assert proc.returncode != 0
    assert "restart budget exceeded" in proc.stderr, proc.stderr[-3000:]
    assert "2 restarts used" in proc.stderr and "max_restarts=1" in proc.stderr, proc.stderr[-3000:]
    attempts = [json.loads(x) for x in (ckpt / "attempts.jsonl").read_text().splitlines()]
    fail_stops = [a["attempt"] for a in attempts if a["event"] == "fail_stop"]
    assert fail_stops == [0, 1], attempts
    assert [a["attempt"] for a in attempts if a["event"] == "restored"] == [1], attempts
    # the job stopped at the budget: no third training attempt, although torchrun allowed 6
    assert not any(a["attempt"] >= 3 for a in attempts)
