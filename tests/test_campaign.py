"""Fault campaigns: the pure expectation, the schedule strategy, the simulation campaign, and the
CI profile of the real-runtime campaign (2 derandomised schedules on 4 CPU ranks)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from accelpact.testing.campaign import Fault, campaign, expected, fault_schedules, plan, simulation_campaign


def test_expected_outcome_follows_the_paper_envelope():
    c = [Fault(3, "committed", 2, "skip"), Fault(5, "committed", 0, "late")]
    assert expected(c, rewind=False).outcome == "preserve" and expected(c, rewind=False).preserved_updates == (3, 5)
    r = expected([*c, Fault(4, "backward", 1, "skip")], rewind=False)
    assert (r.outcome, r.preserved_updates, r.reject_update) == ("reject", (3,), 4)
    k = expected([Fault(3, "committed", 1, "kill"), Fault(3, "committed", 2, "skip")], rewind=False)
    assert (k.outcome, k.reject_update) == ("killed", 3)
    assert plan([Fault(5, "forward", 1, "kill"), Fault(2, "committed", 0, "skip")]) == \
        "skip@2:committed:0,kill@5:forward:1"


@settings(max_examples=200, derandomize=True, deadline=None)
@given(fault_schedules())
def test_schedules_are_valid_fault_plans(faults):
    from accelpact.faults import FaultPlan

    assert 1 <= len(faults) <= 10
    FaultPlan.parse(plan(faults)).validate(4)


def test_simulation_campaign_profile_runs_the_simulation_property():
    assert simulation_campaign(50, seed=1, derandomize=True) == 0


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_runtime_campaign_ci_profile(tmp_path):
    summary = tmp_path / "summary.json"
    assert campaign(2, updates=4, derandomize=True, seed=0, summary=summary) == 0
    data = json.loads(summary.read_text())
    assert data["schedules"] == 2 and not data["failures"], data


def test_a_kill_preempted_by_an_earlier_fault_of_the_same_update_may_end_in_reject():
    """Found by the 40-schedule campaign: rank 2 skipping in forward makes rank 3 fail in forward,
    so rank 3 never reaches its kill point in backward and every rank rejects instead."""
    from accelpact.testing.campaign import Fault, expected

    def paper(*fs):
        return expected(fs, rewind=False)

    assert paper(Fault(2, "backward", 3, "kill"), Fault(2, "forward", 2, "skip")).may_reject
    assert not paper(Fault(2, "backward", 3, "kill"), Fault(2, "backward", 2, "skip")).may_reject
    assert not paper(Fault(2, "forward", 3, "kill")).may_reject
    # with Rewind the pre-empted kill fires in the re-run: killed, unless a split step ends it first
    assert not expected((Fault(2, "backward", 3, "kill"), Fault(2, "forward", 2, "skip"))).may_reject
    assert expected((Fault(2, "committed", 3, "kill"), Fault(2, "optimizer", 2, "skip"))).may_reject


def test_a_late_rank_in_the_optimizer_phase_fails_at_the_boundary_and_is_preserved():
    """Found by reading the fault model: a `late` rank sleeps in the step pre-hook and then steps;
    the first collective that fails is the boundary health check, a committed failure."""
    from accelpact.testing.campaign import Fault, expected

    e = expected((Fault(3, "optimizer", 1, "late"),))
    assert e.outcome == "preserve" and e.preserved_updates == (3,)
    assert expected((Fault(3, "optimizer", 1, "skip"),)).outcome == "reject"
    assert expected((Fault(3, "optimizer", 1, "late"), Fault(3, "forward", 2, "skip")), rewind=False).outcome == "reject"


def test_expected_outcome_with_rewind():
    """Rewind for forward/backward, once per firing; a boundary fault of the same update may be
    preserved after the re-run; a skip inside the step (split tau, no copy) rejects."""
    e = expected([Fault(3, "backward", 1, "skip")])
    assert (e.outcome, e.rewound_updates, e.tokens) == ("rewind", (3,), ("W{1,1}",))
    assert e.matches(["rewind"], observed="rewind") == 0
    assert e.matches(["reject"], observed="reject") is None
    e = expected([Fault(3, "forward", 0, "skip"), Fault(3, "backward", 2, "late"), Fault(3, "committed", 1, "late"),
                  Fault(5, "committed", 3, "skip")])
    assert e.outcome == "rewind" and e.preserved_updates == (5,)
    for ok in (["rewind", "preserve"], ["rewind", "rewind", "preserve"], ["rewind", "preserve", "preserve"]):
        assert e.matches(ok, observed="rewind") == 0, ok
    assert e.matches(["rewind", "rewind", "rewind", "preserve"], observed="rewind") is None  # 2 mid faults
    assert e.matches(["preserve", "rewind", "preserve"], observed="rewind") == 1  # one unscheduled
    r = expected([Fault(2, "forward", 1, "late"), Fault(2, "optimizer", 0, "skip")])
    assert (r.outcome, r.reject_update) == ("reject", 2)
    assert r.matches(["reject"], observed="reject") == 0 and r.matches(["rewind", "reject"], observed="reject") == 0
    k = expected([Fault(2, "backward", 1, "skip"), Fault(4, "forward", 3, "kill")])
    assert (k.outcome, k.rewound_updates, k.reject_update) == ("killed", (2,), 4)


def test_a_shrunk_failing_schedule_is_reproducible_from_the_printed_seed(tmp_path, capsys):
    """The driver's contract: the seed it prints replays the campaign, and hypothesis shrinks a
    failure to the same minimal schedule every time. A stand-in runner fails every schedule that
    holds a kill inside the optimizer step, deterministically, so no process is spawned."""
    from accelpact.testing.campaign import ScheduleResult

    def runner(faults, workdir, **_):
        if any(f.kind == "kill" and f.phase == "optimizer" for f in faults):
            raise AssertionError(f"planted failure in {plan(faults)}")
        return ScheduleResult(plan(faults), "preserve", "preserve", 0.0)

    shrunk = []
    for attempt in range(2):
        summary = tmp_path / f"s{attempt}.json"
        assert campaign(60, updates=6, derandomize=False, seed=424242, summary=summary, runner=runner) == 1
        out = capsys.readouterr()
        assert "seed 424242" in out.out and "--seed 424242" in out.out and "FAILED (seed 424242)" in out.err
        failures = json.loads(summary.read_text())["failures"]
        shrunk.append(failures[-1]["schedule"])  # hypothesis reports the shrunk example last
    assert shrunk[0] == shrunk[1]
    assert shrunk[0] == "kill@2:optimizer:0"  # minimal: one fault, smallest update and rank


def test_only_extra_preserves_are_tolerated_beyond_the_schedule():
    """A peer slower than the data timeout at a boundary is a real failure the runtime must
    preserve; anything else that differs from the envelope's sequence fails the schedule."""
    one = expected([Fault(3, "committed", 1, "skip")], rewind=False)
    assert one.matches(["preserve", "preserve"], observed="preserve") == 1
    assert one.matches(["preserve"], observed="preserve") == 0
    rej = expected([Fault(3, "backward", 1, "skip")], rewind=False)
    assert rej.matches(["preserve", "reject"], observed="reject") == 1
    assert rej.matches(["reject", "preserve"], observed="reject") == 1
    two = expected([Fault(2, "committed", 1, "skip"), Fault(3, "backward", 1, "skip")], rewind=False)
    assert two.matches(["reject"], observed="reject") is None  # the scheduled Preserve is missing
    assert rej.matches(["rewind", "reject"], observed="reject") is None


def test_fault_shares_count_what_fired_and_what_was_recovered_in_memory():
    from accelpact.testing.campaign import fault_shares, parse_plan

    sched = "skip@2:backward:1,late@3:committed:0,skip@5:forward:2"
    assert plan(parse_plan(sched)) == sched
    # paper envelope: the backward fault at update 2 ends the attempt; later faults never fire
    assert fault_shares([(sched, "reject")], rewind=False) == {
        "faults_fired": 1, "faults_in_memory": 0, "faults_in_memory_share": 0.0}
    # with Rewind the same schedule is recovered in memory, every fault
    assert fault_shares([(sched, "rewind")], rewind=True)["faults_in_memory"] == 3
    killed = "late@2:committed:0,kill@4:forward:1,skip@6:backward:0"
    assert fault_shares([(killed, "killed")], rewind=True) == {
        "faults_fired": 2, "faults_in_memory": 1, "faults_in_memory_share": 0.5}


def test_a_kill_preempted_by_the_same_ranks_earlier_fault_may_end_in_reject():
    """Found by the paper-envelope campaign: rank 3 arrives late in forward, its own next
    collective fails, so it never reaches its kill point inside the step and every rank rejects."""
    e = expected((Fault(2, "forward", 3, "late"), Fault(2, "optimizer", 3, "kill")), rewind=False)
    assert e.outcome == "killed" and e.may_reject
    assert e.matches(["reject"], observed="reject") == 0
