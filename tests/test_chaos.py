"""Real link cuts between emulated nodes (accelpact.chaos).

The pure parts (schedules, commands, names, argv, the analysis of records) are tested everywhere.
The end-to-end test builds two network namespaces, runs the demo trainer as a 2-node torchrun job
across them, cuts node 1's link at a committed boundary and restores it inside the recovery
budget: every rank must Preserve, only the cross-node groups may be replaced, the final state must
be bitwise equal to the uninterrupted reference, and the fabric must be gone afterwards. The
node-loss test builds three (HSDP 2x2 on nodes 0-1, two hot spares on node 2), kills node 1 for
good mid-training, and the spare node must take over ranks 2 and 3, bitwise. Both need root and
iproute2 (CI has both) and skip with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from accelpact.chaos import analysis
from accelpact.chaos.campaign import (
    Scenario,
    default_campaign,
    default_node_loss,
    length_classes,
    run_node_loss,
    run_scenario,
)
from accelpact.chaos.job import JobPaths, JobSpec, torchrun_argv, worker_args, worker_env
from accelpact.chaos.nemesis import Cut, CutMethod, anchor_time, cut_commands, parse_schedule, plan_random
from accelpact.chaos.nodeloss import LossMethod, NodeLoss, loss_commands, parse_loss, placement_of, victims
from accelpact.chaos.qualified import EnvelopeUnavailable, plan_envelope, qualify_argv, resolve_envelope
from accelpact.chaos.topology import (
    ChaosUnavailable,
    TopologySpec,
    emulated_nodes,
    list_namespaces,
    preflight,
)

# ------------------------------------------------------------------------------ pure parts


def test_schedule_round_trips_and_rejects_bad_input():
    cuts = parse_schedule("port-block:2.5@8,switch-down:0.4~12+0.02, node-down:9@20+0.1")
    assert [c.method for c in cuts] == [CutMethod.PORT_BLOCK, CutMethod.SWITCH_DOWN, CutMethod.NODE_DOWN]
    assert [c.aligned for c in cuts] == [True, False, True]
    assert cuts[1].offset_s == 0.02 and cuts[0].offset_s == 0.05
    assert parse_schedule(",".join(c.spec() for c in cuts)) == cuts
    for bad in ("laser:1@3", "port-block:x@3", "port-block:1@0", "port-block:1@5,switch-down:1@5"):
        with pytest.raises(ValueError):
            parse_schedule(bad)


def test_random_plan_is_seeded_and_mixes_methods_and_lengths():
    kw = dict(lengths=(0.4, 2.5, 10.0), first_update=4, gap=(3, 5), aligned=0.5)
    a, b = plan_random(11, 6, **kw), plan_random(11, 6, **kw)
    assert a == b and a != plan_random(12, 6, **kw)
    assert {c.length_s for c in a} == {0.4, 2.5, 10.0}  # every length appears in a short campaign
    assert len({c.method for c in a[:4]}) == 4
    assert all(y.update - x.update in (3, 4, 5) for x, y in zip(a, a[1:]))


def test_cut_commands_touch_only_the_fabric_of_the_spec():
    spec = TopologySpec(tag="ab12")
    for method in CutMethod:
        cut, restore = cut_commands(spec, method, node=1)
        assert cut and restore
        for argv in cut + restore:
            text = " ".join(argv)
            assert "ab12" in text, text  # every command names this fabric's namespace or interface
            assert spec.node_if(0) not in text and spec.switch_if(0) not in text  # node 0 is never touched


def test_topology_names_fit_the_kernel_and_addresses_stay_inside_the_subnet():
    spec = TopologySpec.fresh(nodes=2)
    for i in range(2):
        assert len(spec.node_if(i)) <= 15 and len(spec.switch_if(i)) <= 15
        assert spec.address(i).startswith("10.231.0.")
    assert len(spec.bridge) <= 15
    assert not any("default" in " ".join(a) for a in spec.up_commands())  # no route out
    with pytest.raises(ValueError):
        TopologySpec(tag="NOT-OK")
    with pytest.raises(ValueError):
        spec.node_ns(2)


def test_torchrun_argv_has_the_flags_measured_to_work_across_namespaces(tmp_path):
    spec, job, paths = TopologySpec(tag="t1"), JobSpec(updates=5), JobPaths(tmp_path)
    host, other = torchrun_argv(job, spec, 0, paths), torchrun_argv(job, spec, 1, paths)
    assert f"--local-addr={spec.address(1)}" in other and f"--rdzv-endpoint={spec.address(0)}:29400" in other
    assert any("is_host=1" in a for a in host) and not any("is_host=1" in a for a in other)
    assert other[other.index("accelpact.chaos.worker") + 1] == "--"  # torchrun must not eat --local
    env = worker_env(job, spec, 1, paths, base={"ACCELPACT_FAULTS": "skip@1:committed:0", "PATH": "/bin"})
    assert env["GLOO_SOCKET_IFNAME"] == spec.node_if(1) and "ACCELPACT_FAULTS" not in env


def test_length_classes_are_ordered_around_detection_and_budget():
    job = JobSpec(data_timeout_s=2.0, control_timeout_s=5.0, dwell_s=0.4)
    L = length_classes(job)
    assert L["short"] < job.dwell_s + job.data_timeout_s < L["medium"] < L["medium+"]
    assert L["long"] > job.dwell_s + job.data_timeout_s + job.control_timeout_s
    assert len(default_campaign(quick=True)) == 1
    assert sum(len(s.cuts) for s in default_campaign()) >= 5


def test_anchor_waits_for_the_dwell_or_the_commit_after_the_previous_restore():
    marks = [{"kind": "dwell", "update": 8, "t": 10.0}, {"kind": "dwell", "update": 8, "t": 30.0},
             {"kind": "boundary", "update": 9, "result": 0, "t_out": 12.0}]
    assert anchor_time(Cut(CutMethod.PORT_BLOCK, 1.0, 8), marks, after=0.0) == pytest.approx(10.05)
    assert anchor_time(Cut(CutMethod.PORT_BLOCK, 1.0, 8), marks, after=20.0) == pytest.approx(30.05)
    assert anchor_time(Cut(CutMethod.PORT_BLOCK, 1.0, 9, aligned=False, offset_s=0.1), marks, 0.0) == 12.1
    assert anchor_time(Cut(CutMethod.PORT_BLOCK, 1.0, 10), marks, 0.0) is None


def _edge(rank, t, update, action="commit_update"):
    return {"kind": "edge", "rank": rank, "t": t, "update": update, "action": action}


def _nemesis(sched, starts):
    """The nemesis log of `sched`: each cut starts at its time and is restored after its length."""
    out = [{"kind": "schedule", "cuts": sched}]
    for i, t in enumerate(starts):
        out += [{"kind": "cut", "index": i, "t_start": t, "t": t + 0.01},
                {"kind": "restore", "index": i, "t": t + sched[i]["length_s"]}]
    return out


def _recovery(action, phase, t, repair_s, failed):
    return {"kind": "recovery", "action": action, "failure_phase": phase, "t": t, "repair_s": repair_s,
            "failed_groups": failed}


@pytest.mark.parametrize(("action", "failed", "flagged"), [
    ("rewind", ["replicate[0,2]", "replicate[1,3]", "shard[0,1]", "shard[2,3]"], False),  # every group, by design
    ("preserve", ["shard[0,1]"], True),  # a cut between nodes cannot break a group inside node 0
])
def test_only_a_preserve_that_repairs_a_same_node_group_is_a_misdiagnosis(action, failed, flagged):
    """A Rewind rebuilds every group, so its repair set names the same-node groups too: that made
    `make chaos` fail on every cut it rewound in memory."""
    nemesis = _nemesis([{"method": "port-block", "length_s": 2.5, "update": 5, "aligned": True}], (100.0,))
    traces = {r: [{"kind": "attach", "attempt": 0, "t": 1.0, "rank": r},
                  _recovery(action, "backward" if action == "rewind" else "committed", 102.7, 0.05, failed),
                  _edge(r, 103.0, 6)] for r in range(4)}
    marks = {r: [{"kind": "start", "node": str(r // 2)}] for r in range(4)}
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks, attempts=[],
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, 0])
    (cut,) = analysis.analyse(rec, "synthetic").cuts
    assert cut.outcome == action and cut.same_node_replaced is flagged


def test_analysis_classifies_preserve_absorbed_and_restart():
    sched = [{"method": "port-block", "length_s": 2.5, "update": 5, "aligned": True},
             {"method": "switch-down", "length_s": 0.4, "update": 8, "aligned": True},
             {"method": "switch-down", "length_s": 9.0, "update": 12, "aligned": True}]
    nemesis = _nemesis(sched, (100.0, 110.0, 120.0))
    traces, marks = {}, {}
    for r in range(4):
        pair = "replicate[0,2]" if r % 2 == 0 else "replicate[1,3]"
        traces[r] = [{"kind": "attach", "attempt": 0, "t": 1.0, "rank": r},
                     _recovery("preserve", "committed", 102.7, 0.05, [pair]),
                     _edge(r, 103.0, 6), _edge(r, 111.0, 9),
                     {"kind": "attach", "attempt": 1, "t": 131.0, "rank": r}, _edge(r, 133.0, 11)]
        marks[r] = [{"kind": "start", "node": str(r // 2)},
                    {"kind": "boundary", "flag": 1, "t_in": 102.4, "t_out": 102.6, "failed": [pair]},
                    {"kind": "boundary", "flag": 1, "t_in": 122.4, "t_out": 127.4, "error": "timed out"}]
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks,
                              attempts=[{"event": "restored", "attempt": 1, "updates_replayed": 2}],
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, 0])
    rep = analysis.analyse(rec, "synthetic")
    assert [c.outcome for c in rep.cuts] == ["preserve", "absorbed", "restart"]
    first = rep.cuts[0]
    assert first.landed == "boundary" and not first.same_node_replaced
    assert first.detect_s == pytest.approx(2.39) and first.restore_to_progress_s == pytest.approx(0.5)
    assert rep.cuts[2].replayed == 2 and rep.cuts[2].landed == "control"
    assert rep.bitwise == "IDENTICAL" and rep.placement == {0: "0", 1: "0", 2: "1", 3: "1"}
    assert "synthetic" in analysis.format_table([rep])


def test_a_wait_for_links_is_reported_and_not_counted_as_detection():
    """A rank that saw the failure probed its links before its check (`runtime.link_wait`): the
    check's mark is posted after the wait, so detection is taken from where the wait began, and
    the longest wait is its own column."""
    nemesis = _nemesis([{"method": "bridge-drop", "length_s": 2.9, "update": 5, "aligned": True}], (100.0,))
    traces, marks = {}, {}
    for r in range(4):
        pair = "replicate[0,2]" if r % 2 == 0 else "replicate[1,3]"
        traces[r] = [{"kind": "attach", "attempt": 0, "t": 1.0, "rank": r},
                     {"kind": "link_wait", "t": 102.95, "waited_s": 0.6 - 0.01 * r, "rank": r},
                     _recovery("preserve", "committed", 103.0, 0.02, [pair]), _edge(r, 103.2, 6)]
        marks[r] = [{"kind": "start", "node": str(r // 2)},
                    {"kind": "boundary", "flag": 1, "t_in": 102.95, "t_out": 102.97, "failed": [pair]}]
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks, attempts=[],
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, 0])
    (cut,) = analysis.analyse(rec, "synthetic").cuts
    assert cut.detect_s == pytest.approx(102.35 - 100.01)  # the first wait began at 102.35, not the post
    assert cut.probe_s == pytest.approx(0.6)
    assert cut.link_wait_s == pytest.approx(102.97 - 102.9)
    assert "probe" in analysis.format_table([analysis.analyse(rec, "synthetic")])


def test_a_cut_that_a_checkpoint_save_stalled_through_is_absorbed_and_says_where_it_landed():
    """A save runs on the control plane with the data and control timeouts together as its bound
    (`runtime.after_commit`): a medium cut inside it stalls the save, nothing fails. The table
    says the cut landed in the save (it said `none`, and before the bound such a cut restarted)."""
    sched = [{"method": "bridge-drop", "length_s": 4.6, "update": 8, "aligned": False},
             {"method": "port-block", "length_s": 0.4, "update": 12, "aligned": True}]
    nemesis = _nemesis(sched, (100.0, 120.0))
    traces = {r: [{"kind": "attach", "attempt": 0, "t": 1.0, "rank": r},
                  {"kind": "checkpoint", "step": 8, "bytes": 1000, "seconds": 5.3, "t": 105.4, "rank": r},
                  _edge(r, 105.6, 9), _edge(r, 121.0, 13)] for r in range(4)}
    marks = {r: [{"kind": "start", "node": str(r // 2)}] for r in range(4)}
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks, attempts=[],
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, 0])
    saved, later = analysis.analyse(rec, "synthetic").cuts
    assert (saved.outcome, saved.landed) == ("absorbed", "checkpoint")
    assert (later.outcome, later.landed) == ("absorbed", "none")  # no save ran during that one


def test_a_cut_rewound_inside_backward_counts_as_recovered_in_memory_with_its_verdict():
    """Per cut: where it landed (phase), what happened (action) and the run's bitwise verdict; the
    share counts only the cuts that caused a failure."""
    sched = [{"method": "switch-down", "length_s": 3.0, "update": 5, "aligned": False},
             {"method": "port-block", "length_s": 2.5, "update": 8, "aligned": True},
             {"method": "port-block", "length_s": 0.3, "update": 11, "aligned": True},
             {"method": "switch-down", "length_s": 9.0, "update": 14, "aligned": False}]
    nemesis = _nemesis(sched, (100.0, 110.0, 120.0, 130.0))
    traces, marks = {}, {}
    for r in range(4):
        pair = "replicate[0,2]" if r % 2 == 0 else "replicate[1,3]"
        traces[r] = [{"kind": "attach", "attempt": 0, "t": 1.0, "rank": r},
                     _recovery("rewind", "backward", 103.2, 0.06, [pair]),
                     _edge(r, 103.5, 6),
                     _recovery("preserve", "committed", 112.7, 0.05, [pair]),
                     _edge(r, 113.0, 9), _edge(r, 121.0, 12), _edge(r, 130.5, 14),
                     {"kind": "attach", "attempt": 1, "t": 141.0, "rank": r}, _edge(r, 143.0, 13)]
        marks[r] = [{"kind": "start", "node": str(r // 2)},
                    {"kind": "boundary", "flag": 1, "t_in": 112.4, "t_out": 112.6, "failed": [pair]}]
    save_failed = {"event": "fail_stop", "frontier": 14, "reason": "checkpoint save at F=14 failed: timed out"}
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks, attempts=[save_failed],
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, 0])
    rep = analysis.analyse(rec, "synthetic")
    assert [c.outcome for c in rep.cuts] == ["rewind", "preserve", "absorbed", "restart"]
    assert rep.cuts[3].landed == "checkpoint"  # the save of step 14 met the cut: fail-stop, restart
    rewound = rep.cuts[0]
    assert rewound.landed == "backward" and rewound.bitwise == "IDENTICAL"
    assert rewound.repair_s == pytest.approx(0.06) and rewound.detect_s == pytest.approx(103.14 - 100.01)
    assert rewound.restore_to_progress_s == pytest.approx(103.5 - 103.0)
    share = analysis.in_memory_share(rep.cuts)
    assert (share.in_memory, share.failed, share.bitwise_identical) == (2, 3, 2)
    assert share.aligned == (1, 1) and share.unaligned == (1, 2) and share.fraction == pytest.approx(2 / 3)
    line = analysis.format_share(share)
    assert "2/3" in line and "rewind 1" in line and "preserve 1" in line and "restart 1" in line
    table = analysis.format_table([rep])
    assert "rewind" in table and "backward" in table
    assert analysis.in_memory_outcome(["rewind", "preserve", "rewind"]) == "rewind+preserve"
    assert analysis.in_memory_outcome(["rewind", "restart"]) is None and analysis.in_memory_outcome([]) is None


def test_the_campaign_obeys_a_qualified_envelope_or_qualifies_first(tmp_path):
    default = tmp_path / "default.json"
    use = plan_envelope(None, default_path=default, default_problem=None, out=tmp_path)
    assert use.envelope == str(default) and use.qualify_out is None and use.qualified
    first = plan_envelope("auto", default_path=default, default_problem="stale: torch 2.12.0", out=tmp_path)
    assert first.qualify_out == tmp_path / "envelope.json" == Path(first.envelope) and "stale" in first.source
    assert plan_envelope("builtin", default_path=default, default_problem=None, out=tmp_path).qualified is False
    assert plan_envelope("/x/env.json", default_path=default, default_problem=None, out=tmp_path).envelope == "/x/env.json"
    argv = qualify_argv(tmp_path / "e.json", python="py")
    assert argv[0] == "py" and argv[-4:] == ["qualify", "--quick", "--out", str(tmp_path / "e.json")]
    # every scenario's workers get the envelope, and the unaligned scenario keeps its reference (verdict)
    for sc in default_campaign(envelope="/q/env.json"):
        assert sc.job.envelope == "/q/env.json" and sc.job.reference, sc.name
        assert "--envelope=/q/env.json" in worker_args(sc.job, JobPaths(tmp_path))
    assert not any(a.startswith("--envelope") for a in worker_args(JobSpec(), JobPaths(tmp_path)))


def test_an_explicit_envelope_that_is_unusable_stops_the_campaign_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELPACT_ENVELOPE_DIR", str(tmp_path))
    with pytest.raises(EnvelopeUnavailable, match="accelpact qualify"):
        resolve_envelope(str(tmp_path / "missing.json"), tmp_path, log=lambda *_: None)
    ran = []
    with pytest.raises(EnvelopeUnavailable, match="exited 1"):  # no default file: qualify first, which fails
        resolve_envelope(None, tmp_path, log=lambda *_: None, run=lambda argv: ran.append(argv) or 1)
    assert ran and ran[0][-1] == str(tmp_path / "envelope.json")


def test_node_loss_plans_parse_and_never_touch_the_store_host():
    loss = parse_loss("node-vanish:n1~6+0.1")
    assert loss == NodeLoss(LossMethod.VANISH, 6, 0.1, 1) and parse_loss(loss.spec()) == loss
    assert parse_loss("node-kill:n2@4").aligned and parse_loss("node-kill:n1~4").offset_s == 0.05
    for bad in ("node-melt:n1~3", "node-kill:n1~0", "node-kill:nX~3"):
        with pytest.raises(ValueError):
            parse_loss(bad)
    with pytest.raises(ValueError, match="stores"):
        NodeLoss(LossMethod.KILL, 3, node=0)
    spec = TopologySpec(tag="ab12", nodes=3)
    assert loss_commands(spec, NodeLoss(LossMethod.KILL, 3)) == []  # the kill is by pid, in the namespace
    (down,) = loss_commands(spec, loss)
    assert spec.switch_if(1) in down and "down" in down and spec.switch_if(0) not in down
    start = [{"kind": "start", "rank": r, "node": str(r // 2)} for r in range(4)]
    placement = placement_of(start + [{"kind": "start", "rank": 2, "node": "2"}])  # a spare's later start
    assert placement == {0: "0", 1: "0", 2: "1", 3: "1"}
    assert victims(placement, 1, 4) == ([2, 3], "")
    assert "rank 0" in victims({0: "1", 1: "1", 2: "0", 3: "0"}, 1, 4)[1]  # refused: the store's host
    assert "started" in victims({0: "0", 1: "0"}, 1, 4)[1] and "no active rank" in victims(placement, 2, 4)[1]


def test_spare_nodes_follow_the_recipe_and_node_order_is_rank_order(tmp_path):
    spec, paths = TopologySpec(tag="t3", nodes=3), JobPaths(tmp_path)
    job = JobSpec(updates=5, spares=2)
    argv = [torchrun_argv(job, spec, n, paths) for n in range(3)]
    assert all("--max-restarts=0" in a and "--nnodes=3" in a and "--nproc-per-node=2" in a for a in argv)
    assert "--max-restarts=8" in torchrun_argv(JobSpec(updates=5), spec, 1, paths)  # without spares: as before
    env = worker_env(job, spec, 2, paths, base={"ACCELPACT_SPARES": "7"})
    assert env["ACCELPACT_SPARES"] == "2" and env["ACCELPACT_RDZV_ENDPOINT"] == f"{spec.address(0)}:{job.rdzv_port}"
    assert "ACCELPACT_SPARES" not in worker_env(JobSpec(updates=5), spec, 2, paths, base={"ACCELPACT_SPARES": "7"})
    # c10d ranks agents by their sorted --local-addr: node order must be string order (node 0 =
    # group rank 0 = the stores' host, spare nodes last)
    addresses = [TopologySpec(tag="t8", nodes=8).address(i) for i in range(8)]
    assert sorted(addresses) == addresses
    with pytest.raises(ValueError):
        JobSpec(spares=3)  # not whole nodes
    with pytest.raises(ValueError):
        torchrun_argv(JobSpec(spares=4), TopologySpec(tag="t2", nodes=2), 0, paths)  # no active node left
    (kill, vanish) = default_node_loss()
    assert kill.loss.method is LossMethod.KILL and vanish.loss.method is LossMethod.VANISH
    assert kill.world_size == 4 and kill.job.spares == 2 and kill.job.rdzv_port != vanish.job.rdzv_port


def test_analysis_of_a_node_loss_names_the_takeover_and_the_fault_to_frontier():
    t0 = 100.0
    nemesis = [{"kind": "schedule", "losses": [{"spec": "node-kill:n1~5+0", "node": 1}]},
               {"kind": "loss", "ranks": [2, 3], "placement": {str(r): str(r // 2) for r in range(4)}, "t_fault": t0}]
    decided = {"kind": "membership", "event": "decided", "world": 0, "frontier": 5, "assign": {"2": 4, "3": 5},
               "source": {"2": 0, "3": 1}, "lost": [2, 3]}
    traces = {}
    for r in range(4):
        recs = [_edge(r, t0 - 0.1, 5) | {"F": 5}]
        if r < 2:  # survivors
            recs += [{"kind": "membership", "event": "present", "t": t0 + 0.2 + r * 0.01},
                     decided | {"t": t0 + 1.5},
                     {"kind": "membership", "event": "transfer_sent", "bytes": 100, "t": t0 + 4.0},
                     {"kind": "membership", "event": "release", "world": 1, "t": t0 + 4.2},
                     {"kind": "recovery", "action": "replace", "failure_phase": "backward", "t": t0 + 4.2}]
        else:  # the spare appends to the lost rank's trace
            recs += [{"kind": "attach", "attempt": 0, "t": t0 + 3.5},
                     {"kind": "membership", "event": "release", "world": 1, "t": t0 + 4.1}]
        recs.append(_edge(r, t0 + 5.0 + r * 0.01, 6) | {"F": 6})
        traces[r] = recs
    marks = {r: [{"kind": "start", "node": str(r // 2)}] + ([{"kind": "start", "node": "2"}] if r > 1 else [])
             for r in range(4)}
    stderr = "Done waiting for other agents. Elapsed: 0.5 seconds\nDone waiting for other agents. Elapsed: 0.0 seconds"
    rec = analysis.RunRecords(nemesis=nemesis, traces=traces, marks=marks, attempts=[], stderr=stderr,
                              result={"verdicts": [{"rank": r, "mismatches": []} for r in range(4)]},
                              returncodes=[0, -9, 0])
    rep = analysis.analyse_node_loss(rec, "synthetic")
    assert rep.outcome == "replace" and rep.completed and rep.bitwise == "IDENTICAL" and rep.landed == "backward"
    assert rep.lost_ranks == [2, 3] and rep.spares == {"2": 4, "3": 5} and rep.sources == {"2": 0, "3": 1}
    assert rep.placement_after == {0: "0", 1: "0", 2: "2", 3: "2"} and rep.frontier == 5 and rep.bytes_moved == 200
    assert rep.detect_s == pytest.approx(0.2) and rep.agree_s == pytest.approx(1.5)
    assert rep.spare_ready_s == pytest.approx(3.5) and rep.release_s == pytest.approx(4.2)
    assert rep.fault_to_frontier_s == pytest.approx(5.03) and rep.barrier_waits_s == [0.5, 0.0]
    assert "spares" in analysis.format_node_loss(rep)
    refused = analysis.RunRecords(nemesis=[nemesis[0], {"kind": "loss-refused", "why": "holds rank 0"}], traces={},
                                  marks={}, attempts=[], result=None, returncodes=[0, 0, 0])
    assert analysis.analyse_node_loss(refused).outcome == "refused"


# ------------------------------------------------------------------------------ end to end


def _skip_unless_fabric_possible() -> None:
    try:
        preflight()
    except ChaosUnavailable as exc:
        if os.environ.get("CI"):  # CI runs as root with iproute2: the drill must run there
            pytest.fail(f"CI must be able to emulate nodes: {exc}")
        pytest.skip(f"cannot emulate nodes here (needs root and iproute2): {exc}")


@pytest.fixture
def fabric():
    """Two emulated nodes, torn down (and checked gone) however the test ends."""
    _skip_unless_fabric_possible()
    with emulated_nodes(TopologySpec.fresh()) as topo:
        yield topo
    left = [ns for ns in topo.spec.namespaces if ns in list_namespaces()]
    assert not left, f"namespaces left behind: {left}"


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_cut_at_the_boundary_restored_in_budget_is_preserved_bitwise(fabric, tmp_path):
    (sc,) = default_campaign(quick=True)
    sc = replace(sc, timeout_s=110)
    assert isinstance(sc, Scenario) and sc.cuts[0].method is CutMethod.PORT_BLOCK  # iproute2 only
    report = run_scenario(sc, tmp_path, topo=fabric, log=lambda *_: None)
    why = report.message or ""
    (cut,) = report.cuts
    assert report.completed, f"{why}\n{_tails(tmp_path / sc.name)}"
    assert report.placement == {0: "0", 1: "0", 2: "1", 3: "1"}
    assert cut.outcome == "preserve" and cut.landed == "boundary", (cut, _tails(tmp_path / sc.name))
    assert cut.failed_groups and all(g.startswith("replicate") for g in cut.failed_groups), cut
    assert not cut.same_node_replaced
    assert report.bitwise == "IDENTICAL", report.bitwise
    assert report.restarts == 0
    assert (tmp_path / sc.name / "trace" / "nemesis.jsonl").exists()
    assert all((tmp_path / sc.name / "trace" / f"trace-rank{r}.jsonl").exists() for r in range(4))


def _qualified_envelope(path: Path) -> Path:
    """An envelope file for this platform as `accelpact qualify` writes it: Preserve at committed
    boundaries, Rewind in forward, backward and the step (tests never read the machine's own)."""
    from accelpact.envelope import file as ef
    from accelpact.testing.envelopes import passing_evidence

    def row(profile: str, phase: str) -> ef.QualifiedRow:
        actions = ("preserve" if phase == "committed" else "rewind", "reject")
        return ef.QualifiedRow("cpu-gloo", profile, phase, actions, passing_evidence(actions))

    rows = [row(profile, phase) for profile in ("fsdp1-hsdp", "fsdp2-hsdp", "ddp")
            for phase in ("committed", "forward", "backward", "optimizer")]
    return ef.write_envelope(path, rows, ef.platform_fingerprint("gloo", "cpu"))


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_a_cut_inside_an_update_is_rewound_bitwise_under_a_qualified_envelope(fabric, tmp_path):
    """The trainer runs `rt.step` under a qualified envelope; the ranks dwell before update 4's
    forward and the cut starts in that dwell, so it first meets backward's cross-node gradient
    all-reduce (forward's collectives stay inside a node): every rank rewinds update 4 instead of
    restarting, and the end state is bitwise equal to the uninterrupted reference."""
    (sc,) = default_campaign(quick=True, envelope=str(_qualified_envelope(tmp_path / "envelope.json")))
    cut = Cut(CutMethod.PORT_BLOCK, length_classes(sc.job)["medium"] + 0.3, 4)
    sc = replace(sc, name="inside", cuts=(cut,), timeout_s=110,
                 job=replace(sc.job, updates=7, dwell_updates=(4,), dwell_phase="forward", checkpoint_every=0,
                             run_id="chaos-inside", rdzv_port=29415))
    report = run_scenario(sc, tmp_path, topo=fabric, log=lambda *_: None)
    (got,) = report.cuts
    why = f"{got}\n{report.message}\n{_tails(tmp_path / sc.name)}"
    assert report.completed and report.restarts == 0, why
    assert got.outcome == "rewind" and got.landed == "backward", why
    assert got.bitwise == report.bitwise == "IDENTICAL", why
    assert analysis.in_memory_share(report.cuts).fraction == 1.0


@pytest.fixture
def fabric3():
    """Three emulated nodes (two active, one spare), torn down however the test ends."""
    _skip_unless_fabric_possible()
    with emulated_nodes(TopologySpec.fresh(nodes=3)) as topo:
        yield topo
    left = [ns for ns in topo.spec.namespaces if ns in list_namespaces()]
    assert not left, f"namespaces left behind: {left}"


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_a_node_lost_for_good_is_taken_over_by_the_spare_node_bitwise(fabric3, tmp_path):
    """node-kill: node 1's agent and both workers SIGKILLed mid-training. Node 2's spares take
    over ranks 2 and 3 with the state of ranks 0 and 1, the job finishes without a restart and
    without a checkpoint, bitwise equal to the uninterrupted reference; the surviving agents leave
    torchrun's exit barrier at once (the lost agent is checked in for)."""
    sc = next(s for s in default_node_loss() if s.loss.method is LossMethod.KILL)
    sc = replace(sc, timeout_s=200, job=replace(sc.job, updates=8))
    report = run_node_loss(sc, tmp_path, topo=fabric3, log=lambda *_: None)
    why = f"{analysis.format_node_loss(report)}\n{_tails(tmp_path / sc.name, nodes=3)}"
    assert report.outcome == "replace" and report.completed, why
    assert report.placement_before == {0: "0", 1: "0", 2: "1", 3: "1"} and report.lost_ranks == [2, 3], why
    assert report.placement_after == {0: "0", 1: "0", 2: "2", 3: "2"}, why
    assert report.spares == {"2": 4, "3": 5} and report.sources == {"2": 0, "3": 1}, why
    assert report.bitwise == "IDENTICAL", why
    assert report.returncodes[0] == report.returncodes[2] == 0 and report.returncodes[1] == -9, why
    assert report.fault_to_frontier_s is not None and report.fault_to_frontier_s < 60, why
    assert len(report.barrier_waits_s) == 2 and max(report.barrier_waits_s) < 30 and not report.barrier_errors, why


def _tails(root, nodes: int = 2) -> str:
    out = []
    for n in range(nodes):
        path = root / f"node{n}.err"
        if path.exists():
            out.append(f"--- node{n}.err\n" + path.read_text(errors="replace")[-2500:])
    return "\n".join(out)


def test_preflight_refuses_clearly_without_ip(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    if os.geteuid() != 0:
        with pytest.raises(ChaosUnavailable, match="root"):
            preflight()
    else:
        with pytest.raises(ChaosUnavailable, match="iproute2"):
            preflight()


def test_campaign_settings_reach_every_worker_and_a_misspelt_one_is_refused_by_name():
    from accelpact.chaos import campaign

    settings = campaign.parse_settings(["ACCELPACT_LINK_PROBE_S=0"])
    assert settings == (("ACCELPACT_LINK_PROBE_S", "0"),)
    scenarios = campaign.with_settings(campaign.default_campaign(7, quick=True, envelope="builtin"), settings)
    assert scenarios and all(("ACCELPACT_LINK_PROBE_S", "0") in sc.job.extra_env for sc in scenarios)
    with pytest.raises(ValueError, match="did you mean ACCELPACT_LINK_PROBE_S"):
        campaign.parse_settings(["ACCELPACT_LINK_PROB_S=0"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        campaign.parse_settings(["ACCELPACT_LINK_PROBE_S"])
    with pytest.raises(ValueError, match="ACCELPACT_DATA_TIMEOUT_S='abc'"):  # refused here, not in every worker
        campaign.parse_settings(["ACCELPACT_DATA_TIMEOUT_S=abc"])
    assert campaign.parse_settings(["ACCELPACT_SPARES=1"]) == (("ACCELPACT_SPARES", "1"),)  # not Config's: passed on
