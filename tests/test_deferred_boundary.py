"""The deferred committed boundary (`Config.boundary = "deferred"`): the rule, the injector's
boundary faults without probes, and 4-rank worlds that show it is the synchronous protocol
agreed one step late: bitwise equal to an uninterrupted run through rewinds, a trace the spec
accepts, and -- when a peer needs the recovery of a boundary the others went past -- nobody
commits that boundary, the next update is thrown away, and the outcome is the synchronous one."""

from __future__ import annotations

import pytest
import torch

from accelpact.config import Config
from accelpact.errors import ConfigError
from accelpact.faults.inject import InjectedFault
from accelpact.faults.injector import FaultInjector
from accelpact.fsm import table
from accelpact.fsm.deferral import DeferralFacts, why_never_deferred, why_synchronous
from accelpact.fsm.phases import FailurePhase
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world
from model_checking.trace_validation import assert_valid_run

QUALIFIED = frozenset({FailurePhase.FORWARD, FailurePhase.BACKWARD})
ELIGIBLE = DeferralFacts(mode="deferred", in_step=True, rewind_phases=QUALIFIED, step_copy=False,
                         has_cursor=True, checkpoint_due=False, digest_due=False)


def facts(**kw) -> DeferralFacts:
    return DeferralFacts(**{**ELIGIBLE.__dict__, **kw})


def test_a_boundary_is_deferred_only_when_every_condition_holds():
    assert why_synchronous(ELIGIBLE) is None
    assert "sync" in why_synchronous(facts(mode="sync"))
    assert "rt.update()" in why_synchronous(facts(in_step=False))
    assert "checkpoint" in why_synchronous(facts(checkpoint_due=True))
    assert "digest" in why_synchronous(facts(digest_due=True))  # its collectives and Reject stay out of step()
    assert "step_copy" in why_synchronous(facts(step_copy=True))
    why = why_synchronous(facts(rewind_phases=frozenset({FailurePhase.FORWARD})))
    assert "backward" in why and "forward" not in why.split("Rewind in")[1].split(":")[0]
    assert why_never_deferred(frozenset(), step_copy=False, has_cursor=True).count("forward, backward") == 1
    # no cursor: the re-run of the thrown-away update would read the next batch
    assert "data_state" in why_synchronous(facts(has_cursor=False))
    # found by review: a data cursor that cannot be copied leaves no snapshot; deferred anyway, a
    # link broken at the boundary was met in the next update and rejected instead of preserved
    assert "no boundary snapshot could be taken (cannot pickle '_thread.lock')" in why_synchronous(
        facts(snapshot_problem="cannot pickle '_thread.lock'"))


def test_a_runtime_that_cannot_rewind_never_defers_its_boundary():
    """Found by review: the rule asked only whether the envelope qualifies Rewind. With DDP buckets
    it could not isolate (the user's comm hook) or max_rewinds_per_update=0, every Rewind is
    refused, so a link that broke at a deferred boundary (no probes) was met in the next backward
    and rejected, where a synchronous boundary's probe would have preserved it."""
    from accelpact.runtime.rewind import RewindState

    hooked = RewindState(step_copy=False, max_rewinds=3)
    hooked.unisolated_ddp = "DDP model: a comm hook is registered"
    no_budget = RewindState(step_copy=False, max_rewinds=0)
    assert RewindState(step_copy=False, max_rewinds=3).refused_always() == ""
    for state, named in ((hooked, "comm hook"), (no_budget, "max_rewinds_per_update is 0")):
        why = why_synchronous(facts(rewind_refused=state.refused_always()))
        assert why is not None and "cannot rewind" in why and named in why


def test_config_refuses_an_unknown_boundary_mode_by_name():
    assert Config(boundary="deferred").boundary == "deferred"
    with pytest.raises(ConfigError, match="boundary must be one of sync, deferred, got 'lazy'"):
        Config(boundary="lazy")
    assert Config().with_env({"ACCELPACT_BOUNDARY": "deferred"}).boundary == "deferred"


def test_a_boundary_fault_no_probe_met_strikes_in_the_next_forward():
    injector = FaultInjector("skip@2:committed:0", rank=0, data_timeout_s=0.1)
    injector.on_phase(2, FailurePhase.COMMITTED)  # a deferred boundary: no probe follows
    with pytest.raises(InjectedFault):
        injector.on_phase(3, FailurePhase.FORWARD)
    injector.on_phase(4, FailurePhase.FORWARD)  # once

    probed = FaultInjector("skip@2:committed:0", rank=0, data_timeout_s=0.1)
    probed.on_phase(2, FailurePhase.COMMITTED)
    label = probed._boundary.group
    assert probed.before_probe(label) is False  # the probe met it (skipped) ...
    probed.on_phase(3, FailurePhase.FORWARD)  # ... so it does not strike again


def _world(tmp_path, faults: str, updates: int = 6, framework: str = "fsdp2"):
    drill = Drill(framework=framework, updates=updates, faults=faults, rewind=True, envelope="permissive",
                  boundary="deferred", data_timeout_s=1.0, control_timeout_s=6.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(run_drill, 4, drill, timeout_s=180, pg_timeout_s=30)
    for r in results:
        assert {tuple(e) for e in r["edges"]} <= table.edges()
    return results


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_deferred_boundaries_rewind_what_they_meet_and_end_bitwise_equal(tmp_path):
    # skip@2:committed -- no probe at a deferred boundary: the skipped collective is update 3's
    # late@4:optimizer -- rank 2 reaches its boundary after its peers time out in update 5, whose
    #   pending flag is clean: update 4 commits on settle, update 5 is rewound
    results = _world(tmp_path, "skip@2:committed:1,late@4:optimizer:2")
    for r in results:
        assert r["rejected"] is None and r["mismatches"] == [], r
        assert r["frontier"] == 6
        assert [(h["action"], h["frontier"]) for h in r["history"]] == [("rewind", 2), ("rewind", 4)]
        assert r["deferral"]["deferred"] >= 6 and r["deferral"]["joined"] == 0
        assert r["deferral"]["on_thread"] == r["deferral"]["deferred"]  # every check ran off the training thread
    assert_valid_run(tmp_path / "trace")
    # update 4's commit is taken after update 5 timed out: its edge says how late, and the report
    # times update 5's fault from update 4's end (the hang is detection, not update 4's time)
    from accelpact.run_report import load_traces, summarize

    traces = load_traces(tmp_path / "trace")
    for rank in (0, 1, 3):
        (late,) = [r["late_s"] for r in traces[rank] if r.get("action") == "commit_update" and r["F"] == 4]
        assert late >= 1.0, late  # the data timeout
    rewind_of_5 = [rec for rec in summarize(traces).recoveries if rec.frontier_before == 4]
    assert rewind_of_5 and rewind_of_5[0].detect_s >= 1.0, rewind_of_5


JOINS = [
    # FSDP2: rank 1 fails inside its optimizer step of update 3, after its last collective. Its
    # peers finish update 3, post a clean flag and go into update 4, whose collectives wait on
    # rank 1 until they time out: they settle at that failure and join.
    pytest.param("fsdp2", "skip@3:optimizer:1", [0, 2, 3], "failure outside a committed boundary on ranks [1] "
                 "(phase ['optimizer'])", id="fsdp2-join-after-a-failed-collective"),
    # DDP: ranks 1 and 3 fail in backward of update 3 while their replica peers 0 and 2 finish it
    # and step. Those two get through update 4's forward and backward and settle in its
    # optimizer.step() pre-hook: the update unwinds and they join at its boundary, outside the
    # user's code (a Reject raised in the hook would be taken for the update's own error).
    pytest.param("ddp", "skip@3:backward:1", [0, 2], "split optimizer step: ranks [0, 2] applied (or began) update 3",
                 id="ddp-join-from-the-step-pre-hook"),
]


@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("framework", "faults", "joiners", "because"), JOINS)
def test_a_peer_that_needs_the_boundary_recovered_is_joined_and_nobody_commits_it(tmp_path, framework, faults,
                                                                                  joiners, because):
    # Settling says a peer needs the recovery of boundary 3: the ranks past it throw update 4
    # away and join as at boundary 3 (F = 2, their step of update 3 applied). Without a pre-step
    # copy that split step cannot be undone: every rank rejects once, with the same reasons a
    # synchronous boundary gives, and no rank committed update 3 although some went past it.
    results = _world(tmp_path, faults, framework=framework)
    reasons = {tuple(r["rejected"] or ()) for r in results}
    assert len(reasons) == 1 and reasons != {()}, reasons
    (why,) = reasons
    assert any(because in w for w in why), why
    assert any("no pre-step copy" in w for w in why), why
    for r in results:
        assert r["frontier"] == 2, r
        assert [h["action"] for h in r["history"]] == ["reject"], r["history"]
        assert r["deferral"]["joined"] == (1 if r["rank"] in joiners else 0), r
    assert_valid_run(tmp_path / "trace")


def test_a_rank_killed_before_settling_a_deferred_boundary_is_committed_by_implication():
    """A real 4-rank run (campaign schedule kill@2:backward:1, deferred boundaries): rank 1 posted
    its clean flag for update 1 and was killed in update 2 before settling it, so only its peers
    wrote the commit. Their commit proves the all-reduce returned 0, so rank 1 had committed too:
    trace validation inserts that commit in the spec's rank order instead of refusing the run."""
    from pathlib import Path

    from model_checking.trace_validation import segments_of_run

    run = Path(__file__).parent / "fixtures" / "traces" / "deferred-kill4"
    (segment,) = segments_of_run(run)
    commits = [(rec.rank, rec.source is None) for rec in segment.records if rec.action == "commit_update"]
    assert commits == [(0, False), (1, True), (2, False), (3, False)], commits
    assert_valid_run(run, workers=1)


def test_a_run_that_ended_before_any_edge_has_nothing_for_the_spec_to_check(tmp_path):
    """A rank killed right after posting the first deferred boundary leaves that all-reduce
    unsettled: every survivor rejects before any commit, and the traces hold no edge at all."""
    import json

    from model_checking.trace_validation import check_run

    for r in range(2):
        (tmp_path / f"trace-rank{r}.jsonl").write_text(json.dumps({"kind": "attach", "rank": r, "attempt": 0}) + "\n")
    report = check_run(tmp_path, workers=1)
    assert report.ok and "no edge records" in report.describe()


class InterruptedOnce:
    """A check whose first wait is interrupted (Ctrl-C at `rt.update()` entry), then ends clean."""

    def __init__(self):
        self.waits = 0
        self.stuck = False

    def result(self, ticket, control_timeout_s):
        self.waits += 1
        if self.waits == 1:
            raise KeyboardInterrupt
        return 0

    def close(self):
        pass


def test_an_interrupted_settle_keeps_its_boundary_for_the_next_one():
    """The boundary stays pending until its flag is known: dropped before the wait, an interrupt
    there left it neither committed nor joined, and peers that needed its recovery waited for this
    rank's report until they rejected."""
    from types import SimpleNamespace

    from accelpact.runtime.deferred import DeferralCounts, PendingBoundary, settle

    commits = []
    pending = PendingBoundary(update=4, ticket=1, posted=0.0)
    rt = SimpleNamespace(deferral=DeferralCounts(pending=pending, checks=InterruptedOnce()),
                         config=SimpleNamespace(control_timeout_s=1.0), _commit=lambda late_s: commits.append(4))
    with pytest.raises(KeyboardInterrupt):
        settle(rt)
    assert rt.deferral.pending is pending and commits == []
    assert settle(rt) is False and rt.deferral.pending is None and commits == [4]  # close() settles it


def test_close_releases_everything_also_when_its_settle_raises():
    """A close whose settle raised (a Reject under on_reject="raise") still removes the hooks and the
    attached mark and closes the planes, and leaves a control plane open only under a check thread
    that is still waiting in it."""
    from types import SimpleNamespace

    from accelpact.runtime import runtime as shell
    from accelpact.runtime.deferred import DeferralCounts

    closed = []

    def part(name):
        return SimpleNamespace(close=lambda: closed.append(name), remove=lambda: closed.append(name),
                               clear=lambda: closed.append(name))

    def fake(stuck: bool):
        model = torch.nn.Linear(1, 1)
        model.__dict__[shell.ATTACHED] = True
        checks = InterruptedOnce()
        checks.stuck = stuck
        rt = SimpleNamespace(model=model, rank=0, observers=part("observers"), _tracker=part("hooks"),
                             trace=part("trace"), control=part("control"),
                             data_plane=SimpleNamespace(standby=part("standby"),
                                                        restore_timeouts=lambda: closed.append("timeouts")),
                             deferral=DeferralCounts(checks=checks), heartbeat=None, replicator=None,
                             neighbours=None, checkpointer=None)

        def settle():
            raise RuntimeError("the Reject, re-raised")

        rt.settle = settle
        return rt

    for stuck, want in ((False, ["observers", "hooks", "trace", "control", "standby", "timeouts"]),
                        (True, ["observers", "hooks", "trace", "standby", "timeouts"])):
        closed.clear()
        rt = fake(stuck)
        with pytest.raises(RuntimeError, match="re-raised"):
            shell.Runtime.close(rt)
        assert closed == want and shell.ATTACHED not in rt.model.__dict__


def test_settle_is_refused_inside_an_update():
    """Inside the update body a Reject raised by the settle would be taken for the body's own error,
    and a peer's recovery would throw away the update the caller is still running."""
    from types import SimpleNamespace

    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.runtime import Runtime

    rt = SimpleNamespace(_tracker=SimpleNamespace(phase=FailurePhase.BACKWARD))
    with pytest.raises(ConfigError, match="inside an update"):
        Runtime.settle(rt)


def test_attach_says_once_why_no_boundary_will_be_deferred(monkeypatch, caplog):
    """A user who set boundary="deferred" and never gets it (no data cursor, DDP without
    step_copy's envelope...) is told at attach, not left to wonder at the bench."""
    import importlib
    import logging
    from types import SimpleNamespace

    attach = importlib.import_module("accelpact.runtime.attach")  # the module (the package exports a function)
    monkeypatch.setattr(attach, "check_same_settings", lambda group, rank, settings: None)
    rt = SimpleNamespace(config=Config(boundary="deferred"), control=SimpleNamespace(group=None), rank=0)
    envelope = SimpleNamespace(rewind_phases=QUALIFIED, replace_phases=(), describe=lambda: "")
    with caplog.at_level(logging.WARNING, logger="accelpact.runtime"):
        attach._same_settings_everywhere(rt, envelope, "fsdp2", "cpu-gloo", has_data_cursor=False, rewind_refused="")
    assert "every boundary will be agreed synchronously: no data cursor" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accelpact.runtime"):
        attach._same_settings_everywhere(rt, envelope, "fsdp2", "cpu-gloo", has_data_cursor=True,
                                         rewind_refused="DDP's gradient buckets are not isolated: a comm hook")
    assert "synchronously: this runtime cannot rewind (DDP's gradient buckets" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accelpact.runtime"):
        attach._same_settings_everywhere(rt, envelope, "fsdp2", "cpu-gloo", has_data_cursor=True, rewind_refused="")
    assert "synchronously" not in caplog.text


def test_a_check_fault_is_refused_with_deferred_boundaries():
    """Found by review: a deferred boundary's check runs on its own thread, where no after-check
    hook runs, so `kill@U:check:R` and `miss@U:check:R` never fired and the drill seemed to pass."""
    import importlib

    attach = importlib.import_module("accelpact.runtime.attach")
    with pytest.raises(ConfigError, match="miss@3:check:1 strike at a boundary check"):
        attach._injector("miss@3:check:1", False, 0, 2, 0, Config(boundary="deferred"))
    assert attach._injector("miss@3:check:1", False, 0, 2, 0, Config()) is not None  # synchronous: it fires
    assert attach._injector("skip@3:committed:1", False, 0, 2, 0, Config(boundary="deferred")) is not None


def test_a_failed_check_is_the_cause_of_the_update_thrown_away_in_the_step_pre_hook():
    """Found by review: the ControlPlaneError (and the gloo error under it) survived only as text;
    the rejection's chain ended at PeerNeedsRecovery."""
    from types import SimpleNamespace

    from accelpact.errors import ControlPlaneError
    from accelpact.runtime.deferred import (
        DeferralCounts,
        PeerNeedsRecovery,
        PendingBoundary,
        settle_before_step,
    )

    class FailedCheck:
        def result(self, ticket, control_timeout_s):
            raise ControlPlaneError("boundary check all-reduce: Connection closed by peer")

    rt = SimpleNamespace(deferral=DeferralCounts(pending=PendingBoundary(update=4, ticket=1, posted=0.0),
                                                 checks=FailedCheck()),
                         config=SimpleNamespace(control_timeout_s=1.0), update_index=5)
    with pytest.raises(PeerNeedsRecovery) as err:
        settle_before_step(rt)
    assert isinstance(err.value.__cause__, ControlPlaneError) and "Connection closed" in str(err.value.__cause__)


def test_restore_settles_a_boundary_in_flight_before_it_reads_the_checkpoint():
    """Found by review: after rt.step() the deferred check may not have posted its all-reduce
    yet; restore()'s broadcasts on the same control group could then meet it in another order
    on another rank, and settling afterwards moved the restored frontier on by one."""
    from types import SimpleNamespace

    from accelpact.runtime.runtime import Runtime

    calls = []
    fake = SimpleNamespace(settle=lambda: calls.append("settle"),
                           checkpointer=SimpleNamespace(restore=lambda: calls.append("restore") or "restored"))
    assert Runtime.restore(fake) == "restored" and calls == ["settle", "restore"]


def test_an_update_a_join_could_not_throw_away_fails_the_guard_of_the_recovery_it_joins(monkeypatch):
    """Found by review: `_abandon` only logged what it could not discard, trusting the recovery's
    guard to find it; but that recovery is at a committed boundary (no discard) and its guard looks
    at FSDP's training states only, not at gradients: leftover DDP gradients went into the re-run."""
    from types import SimpleNamespace

    from accelpact.fsm.effects import GuardVerdict, Quiesce
    from accelpact.runtime import deferred, discard, executor, guard

    def stuck(model, optimizer):
        raise RuntimeError("Reducer: grads still being reduced")

    monkeypatch.setattr(discard, "discard_partial_update", stuck)
    rt = SimpleNamespace(rank=1, model=None, optimizer=None, deferral=deferred.DeferralCounts(),
                         rewind=SimpleNamespace(snapshot=None, snapshot_problem="cursor holds a lock"))
    deferred._abandon(rt, [], next_update_ran=True)
    assert rt.deferral.left and "Reducer: grads still being reduced" in rt.deferral.left[0]
    # and with no snapshot to restore, that is said too (found by review: it was skipped silently)
    assert rt.deferral.left[1] == "no boundary snapshot to restore (cursor holds a lock)"

    monkeypatch.setattr(guard, "guard", lambda *a, **k: (GuardVerdict(True), {}))
    ex = executor.RecoveryExecutor.__new__(executor.RecoveryExecutor)
    ex.model = ex.optimizer = ex.plane = None
    ex.left_behind, rt.deferral.left = rt.deferral.left, ()
    verdict = ex.quiesce(Quiesce(discard=False, failed=()))
    assert not verdict.ok and "could not be thrown away" in verdict.reason and "Reducer" in verdict.reason
    ex.left_behind = ()
    assert ex.quiesce(Quiesce(discard=False, failed=())).ok


def test_a_snapshot_restore_that_fails_in_a_join_goes_into_the_vote_not_out_of_the_protocol(monkeypatch):
    """Found by review: `_abandon` restored the boundary snapshot unguarded. A restore that
    raised (a buffer whose shape changed, a cursor that does not match) left `rt.step` as a bare
    exception: this rank never reached the recovery it joins, and its peers waited for its report
    until the control timeout. It now fails that recovery's guard, on every rank together."""
    from types import SimpleNamespace

    from accelpact.runtime import deferred, discard

    monkeypatch.setattr(discard, "discard_partial_update", lambda model, optimizer: None)
    monkeypatch.setattr(discard, "partial_state", lambda model, optimizer: [])

    def broken(data_state):
        raise RuntimeError("buffer layers.0.running_mean changed shape")

    rt = SimpleNamespace(rank=1, model=None, optimizer=None, data_state=None, deferral=deferred.DeferralCounts(),
                         rewind=SimpleNamespace(snapshot=SimpleNamespace(restore=broken)))
    deferred._abandon(rt, [], next_update_ran=True)
    assert rt.deferral.left == ("restoring the boundary snapshot failed: RuntimeError: buffer layers.0.running_mean "
                                "changed shape",)


def test_a_deferred_check_that_failed_is_recorded_against_its_own_update_at_the_boundary():
    """Found by review: it was recorded against the update after it (the one running when it was
    settled), with no phase."""
    from types import SimpleNamespace

    from accelpact.errors import ControlPlaneError
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.deferred import DeferralCounts, PendingBoundary, settle

    recorded = []

    class Rejected(Exception):
        pass

    def reject(reason, error, phase=None):
        recorded.append((rt.update_index, phase, reason))
        raise Rejected

    failure = ControlPlaneError("the control group timed out")
    rt = SimpleNamespace(update_index=5, deferral=DeferralCounts(pending=PendingBoundary(4, 1, 0.0, failure=failure)),
                         _reject_without_protocol=reject)
    with pytest.raises(Rejected):
        settle(rt)
    assert recorded[0][:2] == (4, FailurePhase.COMMITTED) and "boundary of update 4" in recorded[0][2]
