"""Trace validation against spec/AccelPact.tla: a synthetic run passes, doctored copies of it are
rejected at the record that breaks them, and the CLI names that record.

The synthetic run is what the runtime writes for a fault at the committed boundary of update 3
on replicate[0,2] of a 4-rank HSDP world (2 nodes x 2), both members observing the failure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelpact.control.clock import ticked
from model_checking import check
from model_checking.trace_validation import (
    causal_violations,
    check_run,
    check_runs,
    merge,
    read_run,
    render_module,
    segments_of_run,
)

WORLD = 4


def _groups(r: int, world: int = WORLD) -> dict[str, str]:
    if world == 2:  # one replica group: the smallest world with a recovery (its checks are cheap)
        return {"replicate": "replicate[0,1]"}
    return {"replicate": f"replicate[{r % 2},{r % 2 + 2}]", "shard": f"shard[{r // 2 * 2},{r // 2 * 2 + 1}]"}


def synthetic_run(observers=(0, 2), failed="replicate[0,2]", updates=5, fault=3, world=WORLD
                  ) -> dict[int, list[dict]]:
    """Per-rank records of a preserved recovery at the committed boundary of update `fault`."""
    members = [int(x) for x in failed[failed.index("[") + 1:-1].split(",")]
    label = failed.split("[")[0]
    out: dict[int, list[dict]] = {}
    for r in range(world):
        recs: list[dict] = [{"kind": "attach", "attempt": 0},
                            {"kind": "config", "world_size": world, "groups": _groups(r, world)}]
        refs = dict.fromkeys(_groups(r, world), 0)

        def edge(seq, action, src, dst, F, g, update, refs=refs, recs=recs):
            recs.append({"kind": "edge", "seq": seq, "action": action, "from": src, "to": dst, "phase": dst,
                         "F": F, "g": g, "refs": dict(refs), "update": update})

        for u in range(1, fault):
            edge(u, "commit_update", "Train", "Train", u, 0, u)
        k, F = fault, fault - 1
        saw = r in observers
        recs.append({"kind": "observe", "seq": k, "update": fault, "phase_failed": "committed", "saw": saw,
                     "failed_groups": [failed] if saw else []})
        edge(k, "observe_failure" if saw else "join_recovery", "Train", "Observe", F, 0, fault)
        edge(k, "enter_guard", "Observe", "Guard", F, 0, fault)
        edge(k, "submit_report", "Guard", "Agree", F, 0, fault)
        if r in members:
            edge(k + 1, "decide_preserve", "Agree", "Replace", F, 0, fault)
            edge(k + 1, "replace_comm", "Replace", "Rebind", F, 0, fault)
            refs[label] = 1
            edge(k + 1, "rebind_refs", "Rebind", "Validate", F, 0, fault)
        else:
            edge(k + 1, "stand_by", "Agree", "Validate", F, 0, fault)
        edge(k + 2, "release", "Validate", "Resume", F, 0, fault)
        edge(k + 2, "resume_training", "Resume", "Train", F, 0, fault)
        recs.append({"kind": "recovery", "action": "preserve", "failed_groups": [failed]})
        for u in range(fault + 1, updates + 1):
            edge(k + 2 + u - fault, "commit_update", "Train", "Train", u, 1, u)
        out[r] = recs
    return out


def clocked(ranks: dict[int, list[dict]], host: str = "") -> dict[int, list[dict]]:
    """The records' vector clocks and times as the control plane would make them: every change of
    seq is an exchange every rank takes part in (boundary check, report gather, votes and the
    outcome register), each record ticks its rank. `t` grows with the exchanges (one host)."""
    def eff(recs):
        seq, out = 0, []
        for rec in recs:
            seq = rec.get("seq", seq)
            out.append(seq)
        return out

    seqs = {r: eff(recs) for r, recs in ranks.items()}
    vc = {r: [0] * len(ranks) for r in ranks}
    pos = dict.fromkeys(ranks, 0)

    def advance(limit, level):
        for r, recs in ranks.items():
            while pos[r] < len(recs) and seqs[r][pos[r]] < limit:
                vc[r][r] += 1
                recs[pos[r]].update(vc=list(vc[r]), t=100.0 * level + pos[r])
                if host and recs[pos[r]].get("kind") == "attach":
                    recs[pos[r]]["host"] = host
                pos[r] += 1

    levels = sorted({s for ss in seqs.values() for s in ss})
    for level, s in enumerate(levels):
        advance(s, level)
        top = [max(v[q] for v in vc.values()) for q in range(len(ranks))]
        for r in vc:
            vc[r] = list(top)
    advance(float("inf"), len(levels))
    return ranks


def write_run(path: Path, ranks: dict[int, list[dict]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for r, recs in ranks.items():
        lines = [json.dumps({"rank": r, "t": float(n), **rec}) for n, rec in enumerate(recs)]
        (path / f"trace-rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    return path


def _find(recs, action):
    return next(n for n, x in enumerate(recs) if x.get("action") == action)


def doctored(tmp_path: Path) -> dict[str, Path]:
    good = synthetic_run()
    runs = {"good": write_run(tmp_path / "good", good)}
    dropped = synthetic_run()
    del dropped[2][_find(dropped[2], "enter_guard")]
    runs["dropped"] = write_run(tmp_path / "dropped", dropped)
    stale = synthetic_run()
    for rec in stale[2][_find(stale[2], "rebind_refs"):]:
        if rec.get("kind") == "edge":
            rec["refs"]["replicate"] = 0
    runs["stale"] = write_run(tmp_path / "stale", stale)
    early = synthetic_run()  # rank 2 repairs only after the others released: release before validation
    for rec in early[2]:
        if rec.get("action") in ("decide_preserve", "replace_comm", "rebind_refs"):
            rec["seq"] = 6
    runs["early_release"] = write_run(tmp_path / "early_release", early)
    runs["skipper_joins"] = write_run(tmp_path / "skipper_joins", synthetic_run(observers=(0,)))
    runs["good_clocked"] = write_run(tmp_path / "good_clocked", clocked(synthetic_run(), host="h"))
    runs["same_seq_release"] = write_run(tmp_path / "same_seq_release", release_alongside_rebind())
    runs["same_seq_release_no_vc"] = write_run(tmp_path / "same_seq_release_no_vc",
                                               strip_clocks(release_alongside_rebind()))
    runs["moved_in_time"] = write_run(tmp_path / "moved_in_time", release_moved_in_time())
    other_hosts = release_moved_in_time()
    n = _find(other_hosts[0], "release")
    other_hosts[0][n]["t"] = other_hosts[0][n - 1]["t"] + 0.1  # in order on its own host, and no
    for r, recs in other_hosts.items():  # host shares its monotonic clock with another
        recs[0]["host"] = f"node{r}"
    runs["other_hosts"] = write_run(tmp_path / "other_hosts", other_hosts)
    runs["late_observer_seq"] = write_run(tmp_path / "late_observer_seq", late_observer_seq())
    runs["stale_clocked"] = write_run(tmp_path / "stale_clocked", stale_in_every_order())
    return runs


#: 2 ranks, one replica group [0,1]: the smallest world with a recovery, cheap to explore
SMALL = {"world": 2, "failed": "replicate[0,1]", "updates": 3, "fault": 2}


def late_observer_seq() -> dict[int, list[dict]]:
    """A good run the merge's tie-break orders wrongly: rank 1 observes the failure, rank 0 (in
    the same group, no error of its own) joins at the boundary check; both learn of it from that
    check, so the clocks call the two records concurrent. Rank 1's record carries the next seq,
    so (seq, stage) puts the join first, which the spec refuses (a member joins only once a peer
    of its group has a failure on record). The other order is a behaviour."""
    run = clocked(synthetic_run(observers=(1,), **SMALL), host="h")
    run[1][_find(run[1], "observe_failure")]["seq"] += 1
    return run


def stale_in_every_order() -> dict[int, list[dict]]:
    """The stale-reference run, clocked, in the small world: rank 1 leaves Rebind still naming
    generation 0, which no order of the concurrent records can explain."""
    run = synthetic_run(observers=(0, 1), **SMALL)
    for rec in run[1][_find(run[1], "rebind_refs"):]:
        if rec.get("kind") == "edge":
            rec["refs"]["replicate"] = 0
    return clocked(run, host="h")


def release_alongside_rebind() -> dict[int, list[dict]]:
    """Issue #18's first doctored trace: rank 0 releases with the seq of rank 2's rebind and the
    clock it had before the votes, i.e. alongside the rebind, without having seen it."""
    run = clocked(synthetic_run())
    recs = run[0]
    n = _find(recs, "release")
    recs[n]["seq"] = run[2][_find(run[2], "rebind_refs")]["seq"]
    recs[n]["vc"] = list(recs[n - 1]["vc"])
    recs[n]["vc"][0] += 1
    return run


def release_moved_in_time() -> dict[int, list[dict]]:
    """Issue #18's second doctored trace: rank 0's release moved before rank 2's report in
    wall-clock time only (seq, stage and clock untouched); every rank on one host."""
    run = clocked(synthetic_run(), host="h")
    run[0][_find(run[0], "release")]["t"] = run[2][_find(run[2], "submit_report")]["t"] - 0.5
    return run


def strip_clocks(run: dict[int, list[dict]]) -> dict[int, list[dict]]:
    for recs in run.values():
        for rec in recs:
            rec.pop("vc", None)
    return run


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    runs = doctored(tmp_path_factory.mktemp("runs"))
    reports = check_runs(list(runs.values()), workers=2)  # ~300,000 states: both cores
    return runs, dict(zip(runs, reports))


# -- pure parts -------------------------------------------------------------------------------------
def test_merge_puts_observers_before_joiners_and_keeps_each_rank_in_order(tmp_path):
    run = write_run(tmp_path / "r", synthetic_run(observers=(2,)))
    merged = merge(read_run(run)[0])
    at3 = [(rec["rank"], rec["action"]) for _, rec in merged if rec["seq"] == 3]
    assert at3[0] == (2, "observe_failure")
    for r in range(WORLD):
        own = [rec["action"] for _, rec in merged if rec["rank"] == r]
        assert own == [x["action"] for x in synthetic_run(observers=(2,))[r] if x.get("kind") == "edge"]


def test_committed_recovery_implies_the_commit_of_the_failed_update(tmp_path):
    segs = segments_of_run(write_run(tmp_path / "r", synthetic_run()))
    assert [len(s.records) for s in segs] == [2 * WORLD + WORLD + 3 * WORLD + 8 + 2 * WORLD, 2 * WORLD]
    first = segs[0]
    assert first.R == frozenset({0, 2})
    implied = [r for r in first.records if r.source is None]
    assert [(r.action, r.rank, r.F) for r in implied] == [("commit_update", q, 3) for q in range(WORLD)]
    release = next(r for r in first.records if r.action == "release")
    assert (release.F, release.g) == (3, 1)
    assert "INSTANCE AccelPact" in render_module(segs)


# -- TLC --------------------------------------------------------------------------------------------
def test_recorded_preserve_passes(verdicts):
    _, rep = verdicts
    assert rep["good"].ok, rep["good"].describe()


def test_dropped_record_is_rejected_at_the_next_record_of_that_rank(verdicts):
    rep = verdicts[1]["dropped"]
    bad = rep.first_failure
    assert bad is not None and bad.first_bad is not None
    assert (bad.first_bad.rank, bad.first_bad.action) == (2, "submit_report")
    assert '2 :> "Observe"' in bad.state_before["phase"]


def test_stale_reference_generation_is_rejected_at_the_rebind(verdicts):
    bad = verdicts[1]["stale"].first_failure
    assert bad is not None and (bad.first_bad.rank, bad.first_bad.action) == (2, "rebind_refs")
    assert "retired = {<<{0, 2}, 0>>}" in verdicts[1]["stale"].describe()  # group {0, 2} at generation 0


def test_release_before_every_rank_validated_is_rejected_at_the_release(verdicts):
    bad = verdicts[1]["early_release"].first_failure
    assert bad is not None and (bad.first_bad.rank, bad.first_bad.action) == (0, "release")
    assert '2 :> "Agree"' in bad.state_before["phase"]


def test_member_of_the_failed_group_that_saw_nothing_may_join(verdicts):
    """The rank that skipped a collective sees no error itself; it joins at the boundary check
    and still repairs its group (found by this checker in real runs, then fixed in the spec)."""
    rep = verdicts[1]["skipper_joins"]
    assert rep.ok, rep.describe()


def test_cli_names_the_first_unexplained_record(tmp_path, capsys):
    runs = doctored(tmp_path)
    assert check.main(["--trace", str(runs["dropped"])]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "rank 2 submit_report: Guard -> Agree" in out and "state before it" in out
    assert "trace-rank2.jsonl:" in out


def test_cli_rejects_a_directory_without_traces(tmp_path, capsys):
    assert check.main(["--trace", str(tmp_path)]) == 1
    assert "no trace-rank" in capsys.readouterr().out


# -- causality (issue #18) ---------------------------------------------------------------------
def test_a_clocked_run_passes_and_is_merged_by_happens_before(verdicts):
    rep = verdicts[1]["good_clocked"]
    assert rep.ok and rep.clocked and not rep.causal, rep.describe()


def test_a_release_given_the_seq_of_a_peers_rebind_is_refused_naming_the_release(verdicts):
    rep = verdicts[1]["same_seq_release"]
    assert rep.result.ok, "merged by seq and stage, TLC alone accepts it: the gap of issue #18"
    assert not rep.ok
    first = rep.causal[0]
    assert (first.rank, first.what.split()[0]) == (0, "release"), rep.describe()
    text = rep.describe()
    assert "released before every rank validated: it has not seen rank 2's rebind_refs" in text, text
    assert "trace-rank0.jsonl:" in first.where and "[trace-rank2.jsonl:" in text


def test_the_same_trace_without_clocks_is_validated_the_old_way(verdicts):
    rep = verdicts[1]["same_seq_release_no_vc"]
    assert rep.ok and not rep.clocked, rep.describe()
    assert "no vector clocks: merged by seq and stage, causality unchecked" in rep.describe()


def test_a_release_moved_before_a_peers_report_in_wall_clock_time_is_refused(verdicts):
    rep = verdicts[1]["moved_in_time"]
    assert rep.result.ok and not rep.ok
    text = rep.describe()
    assert all(v.rank == 0 and v.what.startswith("release") for v in rep.causal), text
    # named against the latest record of rank 2 it has seen (its rebind, after its report)
    assert any("before rank 2's rebind_refs" in v.why and "that it has seen (both on host h" in v.why
               for v in rep.causal), text


def test_a_run_the_merge_orders_wrongly_passes_in_another_order_the_clocks_allow(verdicts):
    """TLC explores the interleavings the clocks allow when the merge's order is refused."""
    runs, rep = verdicts
    merged = [(rec["rank"], rec["action"]) for _, rec in merge(read_run(runs["late_observer_seq"])[0])]
    assert merged.index((0, "join_recovery")) < merged.index((1, "observe_failure"))  # the refused order
    rep = rep["late_observer_seq"]
    assert rep.ok and rep.clocked and not rep.causal, rep.describe()
    recovery = rep.result.verdicts[0]
    assert recovery.explored and "in an order the vector clocks allow other than the merge's" in rep.describe()


def test_a_run_no_order_of_the_clocks_explains_is_refused_naming_the_record(verdicts):
    rep = verdicts[1]["stale_clocked"]
    assert rep.clocked and not rep.causal and not rep.ok
    bad = rep.first_failure
    assert bad is not None and bad.explored and bad.first_bad is not None
    assert [(r.rank, r.action) for r in bad.stuck] == [(1, "rebind_refs")]
    text = rep.describe()
    assert "no order the vector clocks allow is a behaviour" in text and "every order fails at: rank 1 rebind_refs" in text
    assert "retired = {<<{0, 1}, 0>>}" in text and '1 :> "Rebind"' in bad.state_before["phase"], text


def test_an_exploration_out_of_time_leaves_the_merges_refusal_standing(tmp_path, monkeypatch):
    """Exploring costs states: it is bounded, and past the bound the verdict says what it rests on
    (TLC faked: the merge's order is refused at its first record, the exploration times out)."""
    from model_checking import trace_validation as tv

    segs = segments_of_run(write_run(tmp_path / "r", late_observer_seq()))
    explored = []

    def fake_run(segments, explore, spec_dir, timeout_s, workers):
        assert not explore
        return SimpleNamespace(output=f'<<"accelpact-progress", 2, 1, 1, {len(segs[1].records)}>>')  # 2nd passes

    def fake_many(calls, jobs):
        explored.extend((Path(call.args[0]).read_text(), call.keywords["timeout_s"]) for call in calls)
        return [SimpleNamespace(errors=["TLC timed out after 7 s"], output="", trace=[]) for _ in calls]

    monkeypatch.setattr(tv, "_run", fake_run)
    monkeypatch.setattr(tv, "_many", fake_many)
    res = tv.validate_segments(segs, diagnose_failures=False, explore_timeout_s=7)
    (module, timeout_s), = explored  # only the refused segment, and only it is explored
    assert timeout_s == 7 and ", t, pos" in module and module.count("recs |->") == 1  # explored, one segment
    first = res.verdicts[0]
    assert not first.ok and not first.explored and first.first_bad is segs[0].records[0]
    assert "not all explored: TLC timed out after 7 s" in first.describe()


def test_wall_clock_times_of_different_hosts_are_not_compared(verdicts):
    rep = verdicts[1]["other_hosts"]
    assert rep.ok, rep.describe()


def test_a_decision_that_has_not_seen_every_report_is_refused(tmp_path):
    run = clocked(synthetic_run())
    n = _find(run[1], "stand_by")  # rank 1 decides with the clock it had before the gather
    run[1][n]["vc"] = ticked(run[1][n - 1]["vc"], 1)
    found = [v.describe() for v in causal_violations(read_run(write_run(tmp_path / "r", run))[0])]
    assert found and found[0].startswith("rank 1 stand_by"), found
    assert "decided before every rank reported: it has not seen rank 0's submit_report" in found[0]


def test_the_cli_names_the_release_that_did_not_see_the_rebind(tmp_path, capsys):
    run = write_run(tmp_path / "doctored", release_alongside_rebind())
    assert check.main(["--trace", str(run)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "causality: rank 0 release (seq 4" in out and "has not seen rank 2's rebind_refs" in out


def _two_rank_committed_boundary(outcome: str) -> dict[int, list[dict]]:
    """2 ranks, replicate[0,1] fails at the committed boundary of update 3: rank 0 saw it, rank 1
    joined; both decide `outcome` (the records as the runtime writes them)."""
    out = {}
    for r in range(2):
        recs = [{"kind": "attach", "attempt": 0},
                {"kind": "config", "world_size": 2, "groups": {"replicate": "replicate[0,1]"}}]
        refs = {"replicate": 0}

        def edge(seq, action, src, dst, F, recs=recs, refs=refs):
            recs.append({"kind": "edge", "seq": seq, "action": action, "from": src, "to": dst, "phase": dst,
                         "F": F, "g": 0, "refs": dict(refs), "tau": 3 if action != "commit_update" else F})
        for u in (1, 2):
            edge(u, "commit_update", "Train", "Train", u)
        recs.append({"kind": "observe", "seq": 3, "phase_failed": "committed", "saw": r == 0,
                     "failed_groups": ["replicate[0,1]"] if r == 0 else []})
        edge(3, "observe_failure" if r == 0 else "join_recovery", "Train", "Observe", 2)
        edge(3, "enter_guard", "Observe", "Guard", 2)
        edge(3, "submit_report", "Guard", "Agree", 2)
        if outcome == "reject":
            edge(4, "decide_reject", "Agree", "Reject", 2)
            recs.append({"kind": "recovery", "action": "reject", "failed_groups": []})
        else:
            edge(4, "decide_preserve", "Agree", "Replace", 2)
            edge(4, "replace_comm", "Replace", "Rebind", 2)
            refs["replicate"] = 1
            edge(4, "rebind_refs", "Rebind", "Validate", 2)
            edge(5, "release", "Validate", "Resume", 2)
            edge(5, "resume_training", "Resume", "Train", 2)
            recs.append({"kind": "recovery", "action": "preserve", "failed_groups": ["replicate[0,1]"]})
        out[r] = recs
    return clocked(out)


def test_a_reject_at_a_committed_boundary_is_a_behaviour_and_its_joiners_are_checked(tmp_path):
    """Found by review: decide_agreement also rejects a committed boundary for reasons the spec
    did not model (a failed guard, Preserve not qualified: `PreserveQualified`), and every such
    valid run failed validation; and the failed groups were read from the closing `recovery`
    record alone (a Reject names none), so R held only the observers and rank 1, a member of the
    failed group that joined, went unchecked."""
    for outcome in ("preserve", "reject"):
        run = write_run(tmp_path / outcome, _two_rank_committed_boundary(outcome))
        segs = segments_of_run(run)
        assert segs[0].R == frozenset({0, 1}), outcome
        assert segs[0].preserve is (outcome == "preserve")
        rep = check_run(run, workers=1, timeout_s=120)
        assert rep.ok, rep.describe()


def test_no_commit_is_invented_for_a_rank_that_left_no_trace(tmp_path):
    """Found by review: a rank with no trace had every commit of the others implied for it (as
    for a rank that died before settling a deferred boundary), so its missing trace passed.
    Commits are implied only for a rank that wrote records, and once."""
    from model_checking.trace_validation import segments_of_run

    run = synthetic_run(world=2, observers=(0,), failed="replicate[0,1]")
    del run[1]
    segments = segments_of_run(write_run(tmp_path / "run", run))
    assert [(r.action, r.F) for seg in segments for r in seg.records if r.rank == 1 and r.source is None] == []
