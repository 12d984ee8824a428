"""Fault campaigns: the pure expectation, the schedule strategy, the simulation campaign, and the
CI profile of the real-runtime campaign (2 derandomised schedules on 4 CPU ranks)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from accelpact.testing.campaign import Fault, campaign, expected, fault_schedules, plan, simulation_campaign


def test_expected_outcome_follows_the_envelope():
    c = [Fault(3, "committed", 2, "skip"), Fault(5, "committed", 0, "late")]
    assert expected(c).outcome == "preserve" and expected(c).preserved_updates == (3, 5)
    r = expected([*c, Fault(4, "backward", 1, "skip")])
    assert (r.outcome, r.preserved_updates, r.reject_update) == ("reject", (3,), 4)
    k = expected([Fault(3, "committed", 1, "kill"), Fault(3, "committed", 2, "skip")])
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

    assert expected((Fault(2, "backward", 3, "kill"), Fault(2, "forward", 2, "skip"))).may_reject
    assert not expected((Fault(2, "backward", 3, "kill"), Fault(2, "backward", 2, "skip"))).may_reject
    assert not expected((Fault(2, "forward", 3, "kill"),)).may_reject


def test_a_late_rank_in_the_optimizer_phase_fails_at_the_boundary_and_is_preserved():
    """Found by reading the fault model: a `late` rank sleeps in the step pre-hook and then steps;
    the first collective that fails is the boundary health check, a committed failure."""
    from accelpact.testing.campaign import Fault, expected

    e = expected((Fault(3, "optimizer", 1, "late"),))
    assert e.outcome == "preserve" and e.preserved_updates == (3,)
    assert expected((Fault(3, "optimizer", 1, "skip"),)).outcome == "reject"
    assert expected((Fault(3, "optimizer", 1, "late"), Fault(3, "forward", 2, "skip"))).outcome == "reject"


def test_only_extra_preserves_are_tolerated_beyond_the_schedule():
    """A peer slower than the data timeout at a boundary is a real failure the runtime must
    preserve; anything else that differs from the envelope's sequence fails the schedule."""
    from accelpact.testing.campaign import unscheduled_preserves

    assert unscheduled_preserves(["preserve", "preserve"], ["preserve"]) == 1
    assert unscheduled_preserves(["preserve", "restart"], ["restart"]) == 1
    assert unscheduled_preserves(["preserve"], ["preserve"]) == 0
    assert unscheduled_preserves(["restart"], ["preserve", "restart"]) is None
    assert unscheduled_preserves(["restart", "preserve"], ["restart"]) == 1
    assert unscheduled_preserves(["rewind"], []) is None
