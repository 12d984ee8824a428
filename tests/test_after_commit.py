"""The work after a commit (replica digests, the checkpoint save) runs on the control plane with
no detection before it, so a stalled link there is given what a cut at an update is given: the
data timeout plus the control timeout. Pure checks of the stretch and of the untouched hot path,
and a spawned world where one rank stalls in the save for longer than the control timeout: every
rank waits it out, saves, and ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelpact.checkpoint.naming import step_dir_name
from accelpact.control.plane import ControlPlane
from accelpact.runtime import after_commit as after_commit_mod
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

    def after_commit(self, rt) -> None:
        if self.due(rt.frontier):
            self.log.append((type(self).__name__, rt.frontier, rt.control.timeout_s))


class _Digests(_Due):
    pass


class _Checkpointer(_Due):
    pass


def _runtime(frontier: int, log: list) -> SimpleNamespace:
    return SimpleNamespace(frontier=frontier, control=_Plane(5.0), digests=_Digests(3, log), listeners=[],
                           membership=None,
                           checkpointer=_Checkpointer(2, log),
                           config=SimpleNamespace(data_timeout_s=2.0, control_timeout_s=5.0))


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


def test_a_failed_save_rejects_outside_the_stretch() -> None:
    seen: list = []
    rt = _runtime(2, [])

    def fail(_rt) -> None:
        raise OSError("disk full")

    def reject(reason: str, exc: BaseException) -> None:
        seen.append((reason, type(exc).__name__, rt.control.timeout_s))

    rt.checkpointer.after_commit, rt._reject_without_protocol = fail, reject
    after_commit_mod.after_commit(rt)
    assert seen == [("checkpoint save at F=2 failed: OSError: disk full", "OSError", 5.0)]


# ---------------------------------------------------------------- spawned world -----------------
STALL_S = 4.0  # longer than the control timeout (3 s), shorter than data + control (2 + 3 s)


def _stall_in_the_save(rank: int, world_size: int, drill: Drill, stalled: tuple[int, int]) -> dict:
    """Rank `stalled[1]` stops for STALL_S at the start of the save at F=`stalled[0]`, as a rank
    behind a cut link would look to its peers: they wait in the save's first collective."""
    from accelpact.runtime.checkpointing import Checkpointer

    save = Checkpointer.after_commit
    timeouts: list[float] = []

    def stalling(self: Checkpointer, rt) -> None:
        if self.due(rt.frontier):
            timeouts.append(rt.control.timeout_s)
            if (rt.frontier, rank) == stalled:
                time.sleep(STALL_S)
        save(self, rt)

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
