"""The real driver stepped over a fake bus: fixed scenarios and a hypothesis campaign."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelpact.fsm import table
from accelpact.fsm.phases import FailurePhase, Phase, RecoveryAction
from accelpact.fsm.simulation import Scenario, simulate


def test_committed_failure_is_preserved_on_every_rank_at_the_frontier():
    res = simulate(Scenario(4, (0, 2), frontier=9, generation=3), seed=0)
    assert res.actions == {RecoveryAction.PRESERVE}
    assert {(o.frontier, o.generation) for o in res.outcomes.values()} == {(9, 4)}
    # ranks outside R stand by; ranks in R replace and rebind
    triggers = {r: {t for (rr, t, _, _) in res.trace if rr == r} for r in range(4)}
    assert "replace_comm" in triggers[0] and "replace_comm" in triggers[2]
    assert "stand_by" in triggers[1] and "replace_comm" not in triggers[1]
    assert {(t, a, b) for (_, t, a, b) in res.trace} <= table.edges()


def test_uncommitted_failure_is_rejected_everywhere():
    for phase in (FailurePhase.FORWARD, FailurePhase.BACKWARD, FailurePhase.OPTIMIZER):
        res = simulate(Scenario(4, (0, 2), failure_phase=phase), seed=1)
        assert res.actions == {RecoveryAction.RESTART}
        assert res.register == "reject"


def test_one_missed_reference_rejects_all_ranks():
    res = simulate(Scenario(4, (1, 3), rebind_miss=(3,)), seed=2)
    assert res.actions == {RecoveryAction.RESTART}


def test_crash_mid_protocol_rejects_survivors():
    res = simulate(Scenario(4, (0, 2), crash_at={2: Phase.REBIND}), seed=5)
    assert res.crashed == (2,)
    assert res.actions == {RecoveryAction.RESTART}


schedules = st.builds(
    lambda n, grp, phase, skew, lost, crash, miss, rf, vf, lv, gf, seed: (
        Scenario(
            world_size=n,
            failed_group=tuple(sorted(set(g % n for g in grp))) or (0,),
            failure_phase=phase,
            frontier_skew={k % n: v for k, v in skew.items()},
            lost_reports=tuple(x % n for x in lost),
            crash_at={k % n: v for k, v in crash.items()},
            rebind_miss=tuple(x % n for x in miss),
            replace_fail=tuple(x % n for x in rf),
            validate_fail=tuple(x % n for x in vf),
            lost_votes=tuple(x % n for x in lv),
            guard_fail=tuple(x % n for x in gf),
        ),
        seed,
    ),
    st.integers(2, 6),
    st.lists(st.integers(0, 5), min_size=1, max_size=3),
    st.sampled_from(list(FailurePhase)),
    st.dictionaries(st.integers(0, 5), st.integers(-1, 1), max_size=2),
    st.lists(st.integers(0, 5), max_size=1),
    st.dictionaries(st.integers(0, 5), st.sampled_from([Phase.GUARD, Phase.AGREE, Phase.REPLACE, Phase.REBIND, Phase.VALIDATE]), max_size=1),
    st.lists(st.integers(0, 5), max_size=1),
    st.lists(st.integers(0, 5), max_size=1),
    st.lists(st.integers(0, 5), max_size=1),
    st.lists(st.integers(0, 5), max_size=1),
    st.lists(st.integers(0, 5), max_size=1),
    st.integers(0, 2**16),
)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(schedules)
def test_simulated_fault_schedules_keep_every_safety_property(case):
    """Invariants are asserted inside simulate() after every step; here: the envelope's outcome."""
    scenario, seed = case
    res = simulate(scenario, seed=seed)
    clean = (
        scenario.failure_phase is FailurePhase.COMMITTED
        and not any(scenario.frontier_skew.values())
        and not (
            scenario.lost_reports
            or scenario.crash_at
            or scenario.rebind_miss
            or scenario.replace_fail
            or scenario.validate_fail
            or scenario.lost_votes
            or scenario.guard_fail
        )
    )
    assert len(res.actions) == 1, "OutcomeAgreement"
    if clean:
        assert res.actions == {RecoveryAction.PRESERVE}
        return
    if res.crashed or scenario.lost_reports or scenario.lost_votes or scenario.guard_fail:
        assert res.actions == {RecoveryAction.RESTART}
    if res.actions == {RecoveryAction.PRESERVE}:
        # only effect faults on ranks with nothing to repair, or crashes never reached, are harmless
        harmful = set(scenario.rebind_miss) | set(scenario.replace_fail) | set(scenario.validate_fail)
        assert not (harmful & set(scenario.failed_group))
        assert scenario.failure_phase is FailurePhase.COMMITTED and not any(scenario.frontier_skew.values())
