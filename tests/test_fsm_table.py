"""The transition table, the machine built from it, and the pure decisions."""

from __future__ import annotations

import pytest

from accelpact.envelope import DEFAULT_ENVELOPE, ObservationKey, UnknownObservationKey
from accelpact.fsm import table
from accelpact.fsm.decisions import (
    AgreementDecision,
    GroupId,
    RankReport,
    ReleaseVote,
    decide_agreement,
    decide_release,
)
from accelpact.fsm.machine import ProtocolError, RecoveryContext, RecoveryMachine
from accelpact.fsm.phases import FailurePhase, Phase, RecoveryAction

REP = GroupId("replicate", (0, 2))


def report(rank, F=7, g=1, tau=7, phi=FailurePhase.COMMITTED, failed=(), **kw):
    return RankReport(rank, F, g, tau, phi, tuple(failed), **kw)


def all_reports(n=4, over=None):
    over = over or {}
    return [report(r, failed=(REP,) if r in (0, 2) else (), **over.get(r, {})) for r in range(n)]


# -- table -------------------------------------------------------------------------------------


def test_every_phase_is_reachable_and_every_recovery_phase_can_reject():
    dests = {dst for _, _, dst in table.edges()}
    assert set(map(str, Phase)) <= dests | {"Train"}
    rejectable = {"Reject"}
    while True:  # phases with a path to Reject
        more = {src for _, src, dst in table.edges() if dst in rejectable} - rejectable
        if not more:
            break
        rejectable |= more
    for p in ("Observe", "Guard", "Agree", "Replace", "Rebind", "Validate"):
        assert p in rejectable, f"{p} has no path to Reject"


def test_the_effects_column_names_every_effect_class_and_nothing_else():
    from accelpact.fsm.effects import EFFECTS, EFFECTS_BY_NAME

    named = {name for row in table.TRANSITIONS for name in row.effects}
    assert named == set(EFFECTS_BY_NAME), named ^ set(EFFECTS_BY_NAME)
    assert len({cls.handler for cls in EFFECTS}) == len(EFFECTS)  # one handler per effect


def test_resume_only_from_validate_and_only_under_resume_outcome():
    into_resume = [row for row in table.TRANSITIONS if row.dest is Phase.RESUME]
    assert [(r.trigger, r.source) for r in into_resume] == [("release", (Phase.VALIDATE,)),
                                                           ("rewind", (Phase.VALIDATE,))]
    assert [r.conditions for r in into_resume] == [("outcome_is_resume", "decision_is_preserve"),
                                                   ("outcome_is_resume", "decision_is_rewind")]


def test_outcome_phases_have_no_exit_except_resume_to_train():
    out = {(src, dst) for _, src, dst in table.edges() if src in ("Resume", "Reject")}
    assert out == {("Resume", "Train")}


def test_markdown_lists_every_trigger():
    md = table.render_markdown()
    for trig in table.triggers():
        assert f"| {trig} |" in md


# -- machine -----------------------------------------------------------------------------------


def drive_preserve(m: RecoveryMachine, ctx: RecoveryContext):
    m.fire("observe_failure")
    m.fire("enter_guard")
    m.fire("submit_report")
    ctx.decision = decide_agreement(all_reports(), 4)
    m.fire("decide_preserve")
    ctx.replacement_ok = True
    m.fire("replace_comm")
    ctx.proof_ok = True
    m.fire("rebind_refs")
    ctx.outcome = "resume"
    m.fire("release")
    m.fire("resume_training")


def test_machine_follows_the_preserve_path_and_records_edges():
    ctx = RecoveryContext(rank=0)
    seen = []
    m = RecoveryMachine(ctx, on_edge=lambda *e: seen.append(e))
    drive_preserve(m, ctx)
    assert m.phase is Phase.TRAIN
    assert set(m.taken) <= table.edges()
    assert seen == list(m.taken)
    assert [e[0] for e in m.taken][:3] == ["observe_failure", "enter_guard", "submit_report"]


def test_the_edge_log_is_bounded_and_a_recovery_finds_its_own_edges():
    """A clean update fires commit_update: a log of every edge would grow for the life of the job."""
    from accelpact.fsm.machine import EDGES_KEPT

    ctx = RecoveryContext(rank=0)
    m = RecoveryMachine(ctx)
    for _ in range(EDGES_KEPT + 10):
        m.fire("commit_update")
    assert len(m.taken) == EDGES_KEPT and m.fired == EDGES_KEPT + 10
    mark = m.fired
    drive_preserve(m, ctx)
    edges = m.edges_since(mark)
    assert [e[0] for e in edges] == ["observe_failure", "enter_guard", "submit_report", "decide_preserve",
                                     "replace_comm", "rebind_refs", "release", "resume_training"]
    assert m.edges_since(m.fired) == []
    with pytest.raises(ProtocolError, match="kept"):
        m.edges_since(0)  # those edges have left the log


def test_machine_refuses_edges_not_in_table_and_unmet_conditions():
    ctx = RecoveryContext(rank=0)
    m = RecoveryMachine(ctx)
    with pytest.raises(ProtocolError, match="not allowed from Train"):
        m.fire("release")
    with pytest.raises(ProtocolError, match="unknown trigger"):
        m.fire("teleport")
    m.fire("observe_failure")
    m.fire("enter_guard")
    m.fire("submit_report")
    with pytest.raises(ProtocolError, match="conditions do not hold"):
        m.fire("decide_preserve")  # no decision yet
    ctx.decision = decide_agreement(all_reports(), 4)
    assert m.allowed() == ("decide_preserve",)  # rank 0 is in the failed group
    ctx1 = RecoveryContext(rank=1, decision=ctx.decision)
    m1 = RecoveryMachine(ctx1)
    for t in ("join_recovery", "enter_guard", "submit_report"):
        m1.fire(t)
    assert m1.allowed() == ("stand_by",)


def test_release_requires_outcome_register():
    ctx = RecoveryContext(rank=1)
    m = RecoveryMachine(ctx)
    for t in ("join_recovery", "enter_guard", "submit_report"):
        m.fire(t)
    ctx.decision = decide_agreement(all_reports(), 4)
    m.fire("stand_by")
    with pytest.raises(ProtocolError):
        m.fire("release")
    ctx.outcome = "reject"
    assert m.allowed() == ("release_reject",)


# -- decisions ---------------------------------------------------------------------------------


def test_agreement_preserves_when_all_committed_and_equal():
    d = decide_agreement(all_reports(), 4)
    assert d.action is RecoveryAction.PRESERVE
    assert (d.frontier, d.generation) == (8, 1)  # F=7 committed; the boundary's update 8 commits
    assert d.failed_groups == (REP,)
    assert d.repair_ranks == {0, 2}
    assert AgreementDecision.from_dict(d.to_dict()) == d


@pytest.mark.parametrize(
    "over, needle",
    [
        ({3: {"F": 8}}, "frontier F mismatch"),
        ({1: {"g": 2}}, "generation g mismatch"),
        ({2: {"tau": 8}}, "optimizer step tau mismatch"),
        ({0: {"phi": FailurePhase.BACKWARD}}, "outside a committed boundary"),
        ({1: {"guard_ok": False, "guard_reason": "unit 3 not idle"}}, "guard failed on rank 1: unit 3 not idle"),
        ({2: {"preserve_qualified": False}}, "envelope does not qualify preserve at a committed boundary on ranks [2]"),
    ],
)
def test_agreement_rejects_any_mismatch(over, needle):
    d = decide_agreement(all_reports(over=over), 4)
    assert d.action is RecoveryAction.REJECT
    assert any(needle in r for r in d.reasons), d.reasons


DATA = GroupId("data", (0, 1, 2, 3))
UNCOMMITTED = (FailurePhase.FORWARD, FailurePhase.BACKWARD, FailurePhase.OPTIMIZER)


def interrupted(n=4, over=None, phi=FailurePhase.BACKWARD):
    """Ranks 0 and 2 failed mid-update at F=7; 1 and 3 reached the boundary (would-be F=8)."""
    over = over or {}
    out = []
    for r in range(n):
        mid = r in (0, 2)
        kw = dict(phi=phi if mid else FailurePhase.COMMITTED, F=7, tau=7,
                  rewind_phases=UNCOMMITTED, rerun_ok=True, held_groups=(REP, DATA) if mid else (DATA,))
        kw.update(over.get(r, {}))
        out.append(report(r, **kw))
    return out


def test_agreement_rewinds_an_interrupted_update_everyone_can_rerun():
    d = decide_agreement(interrupted(), 4)
    assert d.action is RecoveryAction.REWIND
    assert (d.frontier, d.generation) == (7, 1)  # the committed F, not the boundary's F+1
    assert d.failed_groups == (DATA, REP) and d.repair_ranks == {0, 1, 2, 3}  # every group is rebuilt
    assert AgreementDecision.from_dict(d.to_dict()) == d


@pytest.mark.parametrize(
    "over, needle",
    [
        ({1: {"tau": 8}}, "split optimizer step: ranks [1] applied (or began) update 8, ranks [0, 2, 3] did not"),
        ({r: {"tau": 8} for r in range(4)}, "every rank applied (or began) update 8"),
        ({3: {"F": 6}}, "frontier F mismatch"),
        ({1: {"g": 2}}, "generation g mismatch"),
        ({0: {"rewind_phases": (FailurePhase.FORWARD,)}}, "envelope does not qualify rewind for phase backward on ranks [0]"),
        ({3: {"rerun_ok": False, "rerun_reason": "update body is not re-runnable"}},
         "rank 3 cannot re-run update 8: update body is not re-runnable"),
        ({2: {"guard_ok": False, "guard_reason": "unit 1 still unsharded"}}, "guard failed on rank 2 after discarding"),
        ({1: {"tau": 9}}, "optimizer step tau out of range"),
    ],
)
def test_agreement_rejects_a_rewind_any_rank_cannot_take(over, needle):
    d = decide_agreement(interrupted(over=over), 4)
    assert d.action is RecoveryAction.REJECT
    assert any("outside a committed boundary" in r for r in d.reasons)
    assert any(needle in r for r in d.reasons), d.reasons


def test_agreement_rewinds_a_split_step_when_every_rank_ahead_holds_a_copy():
    d = decide_agreement(interrupted(over={1: {"tau": 8, "step_copy": True}, 3: {"tau": 8, "step_copy": True}}), 4)
    assert d.action is RecoveryAction.REWIND and d.frontier == 7


def test_agreement_rejects_missing_and_foreign_reports():
    reps = all_reports()
    d = decide_agreement([reps[0], None, reps[2], reps[3]], 4)
    assert d.action is RecoveryAction.REJECT and "missing reports from ranks [1]" in d.reasons[0]
    d = decide_agreement([*reps, report(9)], 4)
    assert any("outside world" in r for r in d.reasons)
    d = decide_agreement([report(r) for r in range(4)], 4)
    assert any("nothing to repair" in r for r in d.reasons)
    d = decide_agreement([report(r, failed=(GroupId("control", (0, 1, 2, 3)),)) for r in range(4)], 4)
    assert any("control plane" in r for r in d.reasons)
    with pytest.raises(ValueError):
        decide_agreement([], 0)


def test_agreement_is_independent_of_report_order():
    reps = all_reports()
    assert decide_agreement(reps, 4) == decide_agreement(list(reversed(reps)), 4)


def test_report_round_trips_through_dict():
    r = report(2, failed=(REP,), guard_ok=False, guard_reason="x")
    assert RankReport.from_dict(r.to_dict()) == r
    r = interrupted(over={1: {"tau": 8, "step_copy": True, "rerun_reason": "y"}})[1]
    assert RankReport.from_dict(r.to_dict()) == r
    assert GroupId.parse(REP.key) == REP
    with pytest.raises(ValueError):
        GroupId.parse("replicate")
    with pytest.raises(ValueError):
        GroupId("x", (2, 0))


def test_release_needs_every_vote_ok():
    assert decide_release([ReleaseVote(r, True) for r in range(3)], 3) == (True, ())
    ok, why = decide_release([ReleaseVote(0, True), ReleaseVote(1, False, "proof"), None], 3)
    assert not ok and any("rank 1 voted against" in w for w in why) and any("rank 2" in w for w in why)


# -- envelope ----------------------------------------------------------------------------------


def test_envelope_preserves_only_committed_failures():
    for phase in FailurePhase:
        acts = DEFAULT_ENVELOPE.qualified(ObservationKey("cpu-gloo", "fsdp2-hsdp", phase))
        if phase is FailurePhase.COMMITTED:
            assert acts[0] is RecoveryAction.PRESERVE
        else:
            assert acts == (RecoveryAction.REPLACE, RecoveryAction.REJECT)  # a lost rank, with spares
        assert RecoveryAction.REWIND not in acts and acts[-1] is RecoveryAction.REJECT


def test_builtin_envelope_qualifies_replace_only_where_it_was_measured():
    for platform, profile, measured in (("cpu-gloo", "fsdp2-hsdp", True), ("cpu-gloo", "fsdp1-hsdp", True),
                                        ("cpu-gloo", "ddp", True), ("cuda-nccl", "fsdp2-hsdp", False)):
        for phase in FailurePhase:
            key = ObservationKey(platform, profile, phase)
            assert DEFAULT_ENVELOPE.permits(key, RecoveryAction.REPLACE) is measured, key


def test_envelope_refuses_unknown_keys_by_name():
    with pytest.raises(UnknownObservationKey, match="tpu-ici"):
        DEFAULT_ENVELOPE.qualified(ObservationKey("tpu-ici", "fsdp2-hsdp", FailurePhase.COMMITTED))
    with pytest.raises(UnknownObservationKey, match="zero3"):
        DEFAULT_ENVELOPE.qualified(ObservationKey("cpu-gloo", "zero3", FailurePhase.COMMITTED))


def test_failure_phase_parse_names_the_bad_value():
    assert FailurePhase.parse(" Backward") is FailurePhase.BACKWARD
    with pytest.raises(ValueError, match="'sideways'.*forward, backward"):
        FailurePhase.parse("sideways")


# -- policies moved out of the executor ----------------------------------------------------------


def test_a_failure_inside_the_step_counts_the_step_as_applied():
    from accelpact.fsm.decisions import applied_steps, must_undo_step

    assert applied_steps(7, 7, FailurePhase.OPTIMIZER) == 8  # may be half applied
    assert applied_steps(7, 7, FailurePhase.BACKWARD) == 7
    assert applied_steps(8, 7, FailurePhase.COMMITTED) == 8
    assert must_undo_step(8, 7) and not must_undo_step(7, 7)


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(in_step=False), "use rt.step(fn)"),
        (dict(snapshot_frontier=None, snapshot_problem="(no state_dict)"), "no boundary snapshot of F=7 (no state_dict)"),
        (dict(has_data_cursor=False), "no data cursor"),
        (dict(rewinds=3), "already rewound 3 time(s)"),
        (dict(unisolated_ddp="DDP model: has its own comm hook"), "has its own comm hook"),
    ],
)
def test_may_rerun_names_what_stops_a_rank_from_rewinding(change, needle):
    from dataclasses import replace

    from accelpact.fsm.decisions import RerunFacts, may_rerun

    ok = RerunFacts(frontier=7, update=8, failure_phase=FailurePhase.BACKWARD, in_step=True, snapshot_frontier=7,
                    has_data_cursor=True, rewinds=0, max_rewinds=3)
    assert may_rerun(ok) == (True, "")
    allowed, why = may_rerun(replace(ok, **change))
    assert not allowed and needle in why


def test_envelope_facts_read_preserve_and_rewind_for_the_platform_and_profile():
    from accelpact.envelope import permissive_envelope
    from accelpact.fsm.decisions import envelope_facts

    facts = envelope_facts(DEFAULT_ENVELOPE, "cpu-gloo", "fsdp2-hsdp")
    assert facts.preserve and facts.rewind_phases == ()
    facts = envelope_facts(permissive_envelope("cpu-gloo", "ddp"), "cpu-gloo", "ddp")
    assert facts.preserve and set(facts.rewind_phases) == set(UNCOMMITTED)
    with pytest.raises(UnknownObservationKey, match="zero3"):
        envelope_facts(DEFAULT_ENVELOPE, "cpu-gloo", "zero3")


def test_attach_is_told_what_the_envelope_allows_and_warned_when_the_profile_was_never_measured():
    from accelpact.envelope import Envelope, EnvelopeRow
    from accelpact.fsm.decisions import envelope_facts, envelope_warning

    rows = []
    for profile, measured in (("fsdp2-hsdp", True), ("fsdp1-hsdp", False)):
        for phase in FailurePhase:
            key = ObservationKey("cpu-gloo", profile, phase)
            if not measured:
                rows.append(EnvelopeRow(key, (RecoveryAction.REJECT,), "not_probed: not in this qualification"))
            elif phase is FailurePhase.COMMITTED:
                rows.append(EnvelopeRow(key, (RecoveryAction.PRESERVE, RecoveryAction.REJECT), "preserve: 3/3"))
            else:
                rows.append(EnvelopeRow(key, (RecoveryAction.REWIND, RecoveryAction.REJECT), "rewind: 3/3"))
    env = Envelope(rows)
    fsdp2 = envelope_facts(env, "cpu-gloo", "fsdp2-hsdp")
    assert envelope_warning(fsdp2, "fsdp2-hsdp", "env.json") is None
    assert "committed: preserve, reject" in fsdp2.describe() and "backward: rewind, reject" in fsdp2.describe()
    fsdp1 = envelope_facts(env, "cpu-gloo", "fsdp1-hsdp")
    assert not fsdp1.preserve and fsdp1.rewind_phases == () and len(fsdp1.not_probed) == 4
    warning = envelope_warning(fsdp1, "fsdp1-hsdp", "env.json")
    assert "no measured rows for profile fsdp1-hsdp" in warning and "`accelpact qualify`" in warning


def test_a_bug_on_any_rank_rejects_with_its_name_whatever_else_would_be_recovered():
    d = decide_agreement(all_reports(over={2: {"bug": "KeyError: 'input_ids'"}}), 4)
    assert d.action is RecoveryAction.REJECT
    assert d.reasons == ("rank 2 raised KeyError: 'input_ids' in update 8: not a communication failure, so it is "
                         "not recovered (a rebuild cannot fix it, a rewind would run into it again)",)
    d = decide_agreement(interrupted(over={0: {"bug": "ValueError: malformed batch"}}), 4)
    assert d.action is RecoveryAction.REJECT and "ValueError: malformed batch" in d.reasons[0]


def test_an_unconditional_self_loop_taken_without_the_library_is_the_same_edge():
    """`fire` records commit_update in Train without the library's dispatch: the phase, the edge
    log and on_edge must be what the library gives, and the edge still refused elsewhere."""
    loops = {(r.trigger, str(s)) for r in table.TRANSITIONS for s in r.source
             if s == r.dest and not r.conditions and not r.unless}
    assert loops == {("commit_update", "Train")}
    fast_seen, slow_seen = [], []
    fast = RecoveryMachine(RecoveryContext(rank=0), on_edge=lambda *e: fast_seen.append(e))
    slow = RecoveryMachine(RecoveryContext(rank=0), on_edge=lambda *e: slow_seen.append(e))
    slow._loops = frozenset()  # every edge through the library
    for m in (fast, slow):
        assert m.fire("commit_update") is Phase.TRAIN
        assert m.fire("commit_update") is Phase.TRAIN
    assert fast_seen == slow_seen == [("commit_update", "Train", "Train")] * 2
    assert list(fast.taken) == list(slow.taken) and fast.fired == slow.fired == 2
    for m in (fast, slow):
        m.fire("observe_failure")
        with pytest.raises(ProtocolError, match="not allowed from Observe"):
            m.fire("commit_update")
