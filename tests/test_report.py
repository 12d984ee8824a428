"""`accelpact report`: the summary numbers from real traces of a drill, and from hand-made
records for the cold-restart path; the timeline PNG is written."""

from __future__ import annotations

import importlib.util
import json

import pytest

from accelpact import run_report
from accelpact.run_report import format_summary, load_traces, split_attempts, summarize, timeline

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


# ------------------------------------------------------------------------------ real drill -------
@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_report_of_a_real_committed_fault_drill(tmp_path, capsys):
    from accelpact.testing.drills import Drill, run_drill
    from accelpact.testing.spawn import run_world

    trace = tmp_path / "trace"
    # 2 s data timeout: a loaded 2-core machine must not trip it on its own
    drill = Drill(updates=5, faults="skip@3:committed:1", data_timeout_s=2.0, control_timeout_s=12.0,
                  reference=False, trace_dir=str(trace))
    results = run_world(run_drill, 4, drill, timeout_s=100, pg_timeout_s=30)
    assert all(r["rejected"] is None for r in results)

    summary = summarize(load_traces(trace))
    assert summary.ranks == [0, 1, 2, 3] and summary.attempts == 1
    assert summary.final_frontier == 5
    planned = [r for r in summary.recoveries if r.update == 3]
    assert len(planned) == 1 and all(r.action == "preserve" for r in summary.recoveries)
    rec = planned[0]
    history = [h for h in results[1]["history"] if h["update"] == 3][0]
    assert rec.failure_phase == "committed" and rec.frontier_before == rec.frontier_after == 3
    assert rec.updates_lost == 0 and summary.updates_lost == 0
    assert rec.failed_groups == sorted(history["failed_groups"]) and "replicate[1,3]" in rec.failed_groups
    # detection waits out the data-plane timeout; repair is the slowest rank's, per phase too
    assert 2.0 <= rec.detect_s < 2.0 + 5.0
    per_rank = [h for r in results for h in r["history"] if h["update"] == 3]
    assert len(per_rank) == 4 and rec.repair_s == pytest.approx(max(h["repair_s"] for h in per_rank), rel=1e-6)
    assert {"guard", "agree", "replace", "rebind", "validate"} <= set(rec.phases_s)
    assert rec.rto_s == pytest.approx(rec.detect_s + (rec.t_decided - rec.t_fault - rec.detect_s))
    assert rec.detect_s < rec.rto_s < rec.fault_to_frontier_s  # resumed, then committed update 4
    assert summary.mttd_s == pytest.approx(sum(r.detect_s for r in summary.recoveries) / len(summary.recoveries))
    assert summary.outcomes == {"preserve": len(summary.recoveries)}

    png = tmp_path / "timeline.png"
    from accelpact import cli

    assert cli.main(["report", str(trace), "--png", str(png), "--json", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out
    assert "outcomes: preserve" in text and "MTTD" in text and "updates lost 0" in text
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["final_frontier"] == 5 and doc["updates_lost"] == 0
    if HAVE_MPL:
        assert png.stat().st_size > 10_000
        kinds = {s.kind for s in timeline(load_traces(trace))}
        assert {"update", "detect", "Guard", "Agree"} <= kinds


# ------------------------------------------------------------------------------ hand-made --------
def _commit(rank, f, t, update=None):
    return {"kind": "edge", "action": "commit_update", "from": "Train", "to": "Train", "F": f, "g": 0, "rank": rank,
            "t": t, "update": update or f}


def _restart_traces():
    """Two ranks; checkpoint at 2; backward fault in update 5 (F=4) at t=10; restart; replay 3, 4."""
    traces = {}
    for rank in (0, 1):
        recs = [{"kind": "attach", "attempt": 0, "t": 0.0}, {"kind": "config", "t": 0.1}]
        recs += [_commit(rank, f, 1.0 + f) for f in range(1, 5)]  # commits at 2..5 s
        recs += [
            {"kind": "observe", "t": 7.0 + 0.01 * rank, "update": 5, "phase_failed": "backward", "saw": True},
            {"kind": "edge", "action": "observe_failure", "from": "Train", "to": "Observe", "F": 4, "t": 7.0, "update": 5},
            {"kind": "edge", "action": "decide_reject", "from": "Agree", "to": "Reject", "F": 4, "t": 7.05, "update": 5},
            {"kind": "recovery", "action": "reject", "failure_phase": "backward", "update": 5, "index": 1,
             "frontier": 4, "detect_s": 0.001, "repair_s": 0.04, "timings_s": {"agree": 0.03, "guard": 0.001},
             "failed_groups": [], "t": 7.06 + 0.01 * rank},
            {"kind": "attach", "attempt": 1, "t": 20.0 + rank},
            {"kind": "config", "t": 20.1 + rank},
        ]
        recs += [_commit(rank, f, 22.0 + f + 0.1 * rank) for f in range(3, 7)]  # F 3..6 at 25..28 s
        traces[rank] = recs
    return traces


def test_cold_restart_numbers_from_records():
    s = summarize(_restart_traces())
    assert s.attempts == 2 and s.final_frontier == 6 and s.updates_run == 8
    (rec,) = s.recoveries
    assert rec.action == "reject" and rec.frontier_before == 4 and rec.restored_step == 2
    assert rec.updates_lost == 2  # A = F - C
    # an in-update fault: its instant is bounded by the start of the update (last commit, 5.0 s)
    assert rec.t_fault == 5.0 and rec.detect_s == pytest.approx(7.01 - 5.0)
    assert rec.repair_s == 0.04 and rec.phases_s == {"guard": 0.001, "agree": 0.03}
    assert rec.rto_s == pytest.approx(26.1 - 5.0)  # F=4 again on every rank
    assert rec.fault_to_frontier_s == pytest.approx(27.1 - 5.0)  # F=5, the first past the frontier
    kinds = [seg.kind for seg in timeline(_restart_traces()) if seg.rank == 0]
    assert "restart" in kinds and kinds.count("replay") == 2 and "detect" in kinds
    text = format_summary(s)
    assert "reject 1" in text and "restored C=2" in text and "updates lost 2" in text


def test_the_report_names_published_and_failed_checkpoints():
    traces = _restart_traces()
    for rank, recs in traces.items():
        recs += [{"kind": "checkpoint", "rank": rank, "t": 27.5, "step": 6, "bytes": 10, "seconds": 0.2},
                 {"kind": "checkpoint", "rank": rank, "t": 28.5, "step": 8, "seconds": 0.1,
                  "error": "CheckpointSaveError: writing rank state for step 8 failed on 1 of 2 rank(s)"}]
    s = summarize(traces)
    assert [(c["step"], "error" in c) for c in s.checkpoints] == [(6, False), (8, True)]
    assert ("checkpoints: published 6; failed 8 (CheckpointSaveError: writing rank state for step 8 failed on 1 "
            "of 2 rank(s))") in format_summary(s)
    assert s.to_dict()["checkpoints"][1]["step"] == 8
    assert "checkpoints:" not in format_summary(summarize(_restart_traces()))  # no saves traced, no line


def test_attempts_are_numbered_by_position_and_torn_lines_are_skipped(tmp_path):
    recs = [{"kind": "attach", "attempt": 0, "t": 0}, {"kind": "attach", "attempt": 0, "t": 1}]
    assert [a for a, _ in split_attempts(recs)] == [0, 1]  # a restart inside the same processes
    path = tmp_path / "trace-rank0.jsonl"
    path.write_text(json.dumps({"kind": "attach", "attempt": 0, "t": 0.0}) + "\n" + json.dumps(_commit(0, 1, 1.0))
                    + '\n{"kind": "edge", "t": 2.')
    traces = load_traces(tmp_path)
    assert len(traces[0]) == 2 and summarize(traces).final_frontier == 1
    with pytest.raises(FileNotFoundError):
        load_traces(tmp_path / "nothing")


def test_report_without_matplotlib_still_prints(monkeypatch, tmp_path, capsys):
    import sys

    for rank, recs in _restart_traces().items():
        (tmp_path / f"trace-rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert run_report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "matplotlib is not installed" in out and "updates lost 2" in out
