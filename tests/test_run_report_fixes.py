"""`accelpact report` on what real runs leave: ranks on hosts whose clocks differ, in-memory
recoveries other than Preserve/Replace, a spare taking over a rank's trace, a trace a SIGKILL tore,
phases only some recoveries have, and files the report must not choke on."""

from __future__ import annotations

import json
import logging

import pytest

from accelpact.run_report import (
    attach_evidence,
    format_summary,
    load_traces,
    split_attempts,
    split_processes,
    summarize,
    timeline,
)
from accelpact.trace import TraceWriter


def _commit(rank, f, t):
    return {"kind": "edge", "action": "commit_update", "from": "Train", "to": "Train", "F": f, "g": 0, "rank": rank,
            "t": t, "update": f}


def _observe(t, update, phase):
    return {"kind": "observe", "t": t, "update": update, "phase_failed": phase, "saw": True, "cause": "timeout: x"}


def _recovery(t, update, index, action, phase, frontier, timings=None, detect_s=0.1):
    return {"kind": "recovery", "action": action, "failure_phase": phase, "update": update, "index": index,
            "frontier": frontier, "detect_s": detect_s, "repair_s": 0.05, "timings_s": timings or {"agree": 0.01},
            "failed_groups": ["replicate[0,1]"], "t": t}


# ------------------------------------------------------------------------------ 1: clocks ------
def _two_hosts(offsets=(0.0, 5000.0)):
    """Rank r on a host whose monotonic clock reads offsets[r] more; a committed-boundary fault
    in update 5 (Preserve), then updates 6 and 7."""
    traces = {}
    for rank, off in enumerate(offsets):
        recs = [{"kind": "attach", "attempt": 0, "t": off, "host": f"h{rank}"}]
        recs += [_commit(rank, f, off + 1.0 + f) for f in range(1, 5)]
        recs += [_observe(off + 5.2, 5, "committed"), _recovery(off + 5.3, 5, 1, "preserve", "committed", 5)]
        recs += [_commit(rank, f, off + 6.0 + f - 5) for f in range(6, 8)]
        traces[rank] = recs
    return traces


@pytest.mark.parametrize("offsets", [(0.0, 5000.0), (5000.0, 0.0)])
def test_durations_are_taken_per_rank_not_across_host_clocks(offsets):
    s = summarize(_two_hosts(offsets))
    (rec,) = s.recoveries
    assert rec.detect_s == pytest.approx(0.1)  # observe − own fault (observe − detect_s at a committed boundary)
    assert rec.rto_s == pytest.approx(0.2)
    assert rec.fault_to_frontier_s == pytest.approx(1.9)  # F=6 at +7.0, fault at +5.1
    assert s.wall_s == pytest.approx(8.0)  # the longest host's span, not 5008 s
    text = format_summary(s)
    assert "detect 0.100s" in text and "RTO 0.200s" in text and "fault-to-frontier 1.900s" in text


def test_a_restart_is_measured_on_the_host_each_rank_restarted_on():
    """Two hosts, clocks 5000 s apart; the restart swaps which rank runs where."""
    traces = {}
    for rank, (off, off_next) in enumerate([(0.0, 5000.0), (5000.0, 0.0)]):
        recs = [{"kind": "attach", "attempt": 0, "t": off, "host": f"h{rank}"}]
        recs += [_commit(rank, f, off + f) for f in (1, 2, 3, 4)]  # F=4 at +4 s
        recs += [_observe(off + 6.0, 5, "backward"), _recovery(off + 6.1, 5, 1, "reject", "backward", 4),
                 {"kind": "attach", "attempt": 1, "t": off_next + 10.0, "host": f"h{1 - rank}"}]
        recs += [_commit(rank, f, off_next + 10.0 + f) for f in (3, 4, 5)]  # restored C=2, F=4 at +14 s
        traces[rank] = recs
    (rec,) = summarize(traces).recoveries
    assert rec.restored_step == 2 and rec.updates_lost == 2
    assert rec.rto_s == pytest.approx(10.0) and rec.fault_to_frontier_s == pytest.approx(11.0)


def test_evidence_is_matched_on_each_ranks_own_clock(tmp_path):
    s = summarize(_two_hosts((5000.0, 0.0)))  # rank 0's clock is far ahead of rank 1's
    (rec,) = s.recoveries
    # rank 0's file: an earlier incident #1 of the same index (an earlier process), then this one's
    docs = [{"kind": "incident", "index": 1, "t": 5000.5, "cause": "stale"},
            {"kind": "incident", "index": 1, "t": 5005.35, "cause": "this one"}]
    (tmp_path / "incidents-rank0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "incidents-rank1.jsonl").write_text(json.dumps({"kind": "incident", "index": 1, "t": 5.35,
                                                               "cause": "this one"}) + "\n")
    attach_evidence(s, tmp_path)
    assert rec.evidence[0]["cause"] == "this one" and rec.evidence[1]["cause"] == "this one"


# ------------------------------------------------------------------------------ 2: in memory ---
def _in_memory_traces(action, restart_later):
    """A backward fault in update 5 (F=4) recovered in memory by `action`; later, maybe, a reject
    and a restart from checkpoint 6."""
    traces = {}
    for rank in (0, 1):
        recs = [{"kind": "attach", "attempt": 0, "t": 0.0}, {"kind": "config", "t": 0.1}]
        recs += [_commit(rank, f, 1.0 + f) for f in range(1, 5)]  # F=4 at 5 s
        recs += [_observe(7.0, 5, "backward"), _recovery(7.1, 5, 1, action, "backward", 4)]
        recs += [_commit(rank, f, 7.5 + f - 5) for f in range(5, 9)]  # F=5 at 7.5 s
        if restart_later:
            recs += [_observe(12.0, 9, "backward"), _recovery(12.1, 9, 2, "reject", "backward", 8),
                     {"kind": "attach", "attempt": 1, "t": 20.0}]
            recs += [_commit(rank, f, 20.0 + f) for f in range(7, 10)]
        traces[rank] = recs
    return traces


@pytest.mark.parametrize("action", ["rewind", "shrink"])
@pytest.mark.parametrize("restart_later", [False, True])
def test_rewind_and_shrink_resume_in_memory(action, restart_later):
    rec = summarize(_in_memory_traces(action, restart_later)).recoveries[0]
    assert rec.action == action
    assert rec.rto_s == pytest.approx(2.1)  # decided at 7.1, fault bounded by the last commit at 5.0
    assert rec.fault_to_frontier_s == pytest.approx(2.5)
    assert rec.updates_lost == 0 and rec.restored_step is None


# ------------------------------------------------------------------------------ 3: spares ------
def _spare_traces(joined=True):
    """Rank 1 is lost in update 4 and a spare takes over its position (its trace file): the
    spare's own attach record lands in trace-rank1.jsonl."""
    r0 = [{"kind": "attach", "attempt": 0, "t": 0.0}] + [_commit(0, f, f) for f in (1, 2, 3)]
    r0 += [_observe(6.0, 4, "forward"), _recovery(7.0, 4, 1, "replace", "forward", 3)]
    r0 += [_commit(0, f, 4 + f) for f in (4, 5, 6)]
    r0 += [_observe(12.0, 7, "committed"), _recovery(12.1, 7, 2, "preserve", "committed", 7), _commit(0, 8, 13.0)]
    r1 = [{"kind": "attach", "attempt": 0, "t": 0.0}] + [_commit(1, f, f) for f in (1, 2, 3)]
    r1 += [{"kind": "attach", "attempt": 0, "t": 6.5, "pid": 2}, {"kind": "config", "t": 6.6},
           {"kind": "membership", "event": "world_built", "world": 1, "t": 6.7},
           {"kind": "membership", "event": "activated", "world": 1, "position": 1, "spare": 2, "t": 6.7}]
    r1 += [{"kind": "joined", "t": 6.9}] if joined else []
    r1 += [_commit(1, f, 4 + f) for f in (4, 5, 6)]
    r1 += [_observe(12.0, 7, "committed"), _recovery(12.1, 7, 2, "preserve", "committed", 7), _commit(1, 8, 13.0)]
    return {0: r0, 1: r1}


@pytest.mark.parametrize("joined", [True, False])
def test_a_spare_taking_over_a_rank_opens_no_attempt(joined):
    traces = _spare_traces(joined)
    assert [a for a, _ in split_attempts(traces[1])] == [0]
    s = summarize(traces)
    assert s.attempts == 1
    assert [(r.index, r.action, r.ranks) for r in s.recoveries] == [(1, "replace", [0]), (2, "preserve", [0, 1])]
    assert "attempts 1" in format_summary(s)
    bars = [(seg.kind, seg.start, seg.end) for seg in timeline(traces) if seg.rank == 1 and seg.kind == "restart"]
    assert bars == [("restart", 3.0, 6.5)]  # the lost process's last commit to the spare's attach


def test_split_processes_still_cuts_at_the_spares_attach():
    assert [len(recs) for _, recs in split_processes(_spare_traces()[1])] == [4, 11]


def test_a_restart_still_opens_an_attempt():
    recs = [{"kind": "attach", "attempt": 0, "t": 0.0}, {"kind": "config", "t": 0.1}, _commit(0, 1, 1.0),
            {"kind": "attach", "attempt": 1, "t": 5.0}, {"kind": "config", "t": 5.1}, _commit(0, 1, 6.0),
            {"kind": "membership", "event": "train", "t": 6.5}]
    assert [a for a, _ in split_attempts(recs)] == [0, 1]


# ------------------------------------------------------------------------------ 4: torn line ---
def test_a_restart_after_a_torn_line_keeps_its_attach_record(tmp_path):
    path = tmp_path / "trace-rank0.jsonl"
    path.write_text(json.dumps({"kind": "attach", "attempt": 0, "t": 0.0, "rank": 0}) + "\n"
                    + json.dumps(_commit(0, 1, 1.0)) + "\n" + '{"kind": "edge", "t": 2.')  # SIGKILLed mid-line
    writer = TraceWriter(tmp_path, 0, attempt=1)  # the restarted process
    writer.write(_commit(0, 2, 5.0))
    writer.close()
    kinds = [r["kind"] for r in load_traces(tmp_path)[0]]
    assert kinds == ["attach", "edge", "attach", "edge"]
    assert summarize(load_traces(tmp_path)).attempts == 2


def test_a_whole_or_new_trace_gets_no_blank_line(tmp_path):
    TraceWriter(tmp_path, 0).close()
    TraceWriter(tmp_path, 0, attempt=1).close()
    lines = (tmp_path / "trace-rank0.jsonl").read_text().split("\n")
    assert len(lines) == 3 and lines[-1] == "" and all(lines[:2])


# ------------------------------------------------------------------------------ 5: phases ------
def _phase_traces():
    traces = {}
    for rank in (0, 1):
        recs = [{"kind": "attach", "attempt": 0, "t": 0.0}] + [_commit(rank, f, f) for f in (1, 2, 3)]
        recs += [_observe(4.0, 4, "committed"),
                 _recovery(4.1, 4, 1, "preserve", "committed", 4, {"agree": 0.01, "replace": 0.02})]
        recs += [_commit(rank, 5, 5.0)]
        recs += [_observe(6.0, 6, "forward"),
                 _recovery(9.1, 6, 2, "replace", "forward", 5,
                           {"zzz": 0.001, "transfer": 0.05, "control": 2.5, "agree": 0.01, "rebuild": 0.4})]
        recs += [_commit(rank, 6, 10.0)]
        traces[rank] = recs
    return traces


def test_mean_per_phase_counts_only_recoveries_that_ran_the_phase():
    s = summarize(_phase_traces())
    means = s.mean_phases_s
    assert list(means) == ["agree", "replace", "rebuild", "control", "transfer", "zzz"]  # known order, then new
    assert means["replace"] == pytest.approx(0.02) and means["agree"] == pytest.approx(0.01)
    assert means["control"] == pytest.approx(2.5) and means["zzz"] == pytest.approx(0.001)
    assert list(s.recoveries[1].phases_s) == ["agree", "rebuild", "control", "transfer", "zzz"]
    assert "control 2500.0ms" in format_summary(s).splitlines()[-1]


def test_updates_run_counts_the_update_a_preserve_committed():
    assert summarize(_phase_traces()).updates_run == 6  # commits 1, 2, 3, (Preserve) 4, 5, 6


# ------------------------------------------------------------------------------ 6: bad input ---
def test_trace_files_with_other_names_are_ignored(tmp_path, caplog):
    (tmp_path / "trace-rank0.jsonl").write_text(json.dumps(_commit(0, 1, 1.0)) + "\n")
    (tmp_path / "trace-rank0.bak.jsonl").write_text(json.dumps(_commit(0, 9, 1.0)) + "\n")
    (tmp_path / "incidents-rank0.bak.jsonl").write_text("{}\n")
    with caplog.at_level(logging.WARNING, logger="accelpact.report"):
        traces = load_traces(tmp_path)
    assert list(traces) == [0] and traces[0][0]["F"] == 1
    assert "trace-rank0.bak.jsonl" in caplog.text
    attach_evidence(summarize(traces), tmp_path)  # no int('0.bak')


def test_a_bad_line_inside_a_trace_is_named(tmp_path, caplog):
    good = [json.dumps({"kind": "attach", "attempt": 0, "t": 0.0}), json.dumps(_commit(0, 1, 1.0))]
    torn_then_restart = [*good, '{"kind": "edge", "t": 2.', json.dumps({"kind": "attach", "attempt": 1, "t": 3.0})]
    (tmp_path / "trace-rank0.jsonl").write_text("\n".join([*good, "garbage", "[1, 2]", json.dumps(_commit(0, 2, 2.0))]))
    (tmp_path / "trace-rank1.jsonl").write_text("\n".join([*good, '{"kind": "edge", "t": 2.']))  # torn last line
    (tmp_path / "trace-rank2.jsonl").write_text("\n".join(torn_then_restart) + "\n")  # torn, then a restart
    with caplog.at_level(logging.WARNING, logger="accelpact.report"):
        traces = load_traces(tmp_path)
    assert [r["kind"] for r in traces[0]] == ["attach", "edge", "edge"]
    assert len(traces[1]) == 2 and len(traces[2]) == 3
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert all("trace-rank0.jsonl" in w for w in warned)
    assert "line 3" in warned[0] and "line 4" in warned[1]


def test_a_missing_run_directory_is_named(tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*no such directory"):
        load_traces(missing)
    with pytest.raises(FileNotFoundError, match=f"no trace-rank\\*.jsonl in {tmp_path}"):
        load_traces(tmp_path)


def test_an_incident_log_after_a_torn_line_keeps_its_first_record(tmp_path):
    """The incident log appends like the trace: a killed writer's torn last line swallowed the
    next process's first incident."""
    import json

    from accelpact.observe.incident_log import IncidentLog

    path = tmp_path / "incidents-rank0.jsonl"
    path.write_text('{"kind": "incident", "index": 1}\n{"kind": "incid')  # killed mid-record

    class _Evidence:
        index, rank, sentence = 2, 0, "rank 0 timed out"

        def to_dict(self):
            return {"index": 2}

    log = IncidentLog.__new__(IncidentLog)
    log.path, log._fh = path, None
    log._write(_Evidence())
    log.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"kind": "incident", "index": 2}


def test_a_trace_write_that_fails_stops_the_trace_not_the_run(tmp_path, caplog):
    """Found by review: a full trace disk raised out of `_on_edge`, on every state-machine edge, a
    recovery's included (this rank then left the protocol while its peers waited)."""
    import logging

    from accelpact.trace import TraceWriter

    writer = TraceWriter(tmp_path, rank=0)

    class _Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    writer._fh = _Full()
    with caplog.at_level(logging.ERROR, logger="accelpact.trace"):
        writer.edge(seq=1, action="commit_update", src="Train", dst="Train", frontier=1, generation=0, refs={})
        writer.write({"kind": "observe"})  # nothing more is attempted
    assert not writer.enabled and "No space left on device" in writer.failed
    assert caplog.text.count("stopped at a failed write") == 1


def test_a_deferred_commit_taken_during_a_hung_update_times_the_fault_from_its_updates_end():
    """With deferred boundaries update 4 is committed while update 5 runs; when update 5 hangs, the
    commit edge is written after the hang (t=6.9). Detection was measured from there (0.1 s);
    the update ended at 5.0 (the edge's late_s), so the hang counts: 2.0 s."""
    traces = {}
    for rank in (0, 1):
        recs = [{"kind": "attach", "attempt": 0, "t": 0.0}] + [_commit(rank, f, float(f)) for f in (1, 2, 3)]
        recs += [dict(_commit(rank, 4, 6.9), late_s=1.9), _observe(7.0, 5, "forward"),
                 _recovery(7.1, 5, 1, "rewind", "forward", 4)]
        recs += [_commit(rank, 5, 8.0)]
        traces[rank] = recs
    (rec,) = summarize(traces).recoveries
    assert rec.detect_s == pytest.approx(2.0) and rec.rto_s == pytest.approx(2.1)


def test_a_trace_records_how_late_a_deferred_commit_was_taken(tmp_path):
    trace = TraceWriter(str(tmp_path), 0, 0)
    refs = {"replicate": 0}
    trace.edge(seq=0, action="commit_update", src="Train", dst="Train", frontier=1, generation=0, refs=refs)
    trace.edge(seq=0, action="commit_update", src="Train", dst="Train", frontier=2, generation=0, refs=refs,
               late_s=0.25)
    trace.close()
    edges = [r for r in load_traces(tmp_path)[0] if r.get("kind") == "edge"]
    assert "late_s" not in edges[0] and edges[1]["late_s"] == 0.25


def test_a_trace_record_without_its_time_is_skipped_with_a_warning_not_a_traceback(tmp_path, caplog):
    """Found by review: `accelpact report` on a trace with one record missing "t" (or "t": null)
    ended in a KeyError / TypeError traceback; a damaged record is now skipped and named."""


    lines = [{"kind": "attach", "t": 1.0}, {"kind": "edge", "action": "commit_update"},
             {"kind": "edge", "t": None}, {"kind": "edge", "t": True}, {"kind": "edge", "t": 2.5}]
    (tmp_path / "trace-rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with caplog.at_level(logging.WARNING, logger="accelpact"):
        traces = load_traces(tmp_path)
    assert [r["t"] for r in traces[0]] == [1.0, 2.5]
    assert [m for m in caplog.messages if "no number under ['t']" in m and "line " in m][:1], caplog.messages
    assert len([m for m in caplog.messages if "no number under" in m]) == 3


@pytest.mark.parametrize("rank0_phase", ["committed", "backward"])
def test_a_rewind_is_measured_the_same_whichever_rank_reached_its_boundary(rank0_phase):
    """Found by review: the frontier before the failure was read off the lowest rank's phase. With
    rank 0 at its boundary and rank 1 failing in backward (a Rewind to F=4 of update 5), it counted
    one update lost and measured progress up to the commit after the re-run."""
    traces = {}
    for rank, phase in ((0, rank0_phase), (1, "backward")):
        recs = [{"kind": "attach", "attempt": 0, "t": 0.0}] + [_commit(rank, f, float(f)) for f in range(1, 5)]
        recs += [_observe(6.0, 5, phase), _recovery(6.5, 5, 1, "rewind", phase, 4)]
        recs += [_commit(rank, 5, 8.0), _commit(rank, 6, 9.0)]
        traces[rank] = recs
    rec = summarize(traces).recoveries[0]
    assert rec.action == "rewind" and rec.updates_lost == 0 and rec.frontier_before == 4
    # to the re-run of update 5 (at 8.0), from rank 1's fault (the start of update 5, at 4.0); the
    # commit of 6 (at 9.0) made it 5.0
    assert rec.fault_to_frontier_s == pytest.approx(4.0)
