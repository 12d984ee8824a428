"""The runtime's collaborators, each alone: the edge that exits, the drill's injector, evidence,
detection. (Multi-process behaviour is in test_runtime.py and test_rewind.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from accelpact.errors import ConfigError, RecoveryRejected, UnsupportedModelError
from accelpact.faults import FaultInjector, InjectedFault
from accelpact.fsm.phases import FailurePhase, RecoveryAction
from accelpact.runtime.detect import detect_profile
from accelpact.runtime.evidence import evidence_of, write_reject_evidence
from accelpact.runtime.fail_stop import fail_stop
from accelpact.runtime.history import RecoveryRecord


def test_fail_stop_reraises_for_embedding_code():
    exc = RecoveryRejected(("peer lost",))
    with pytest.raises(RecoveryRejected) as got:
        fail_stop(exc, on_reject="raise", rank=0)
    assert got.value is exc


@pytest.mark.parametrize("make, code, said", [
    ("RecoveryRejected(('peer lost',))", 75, "recovery rejected (exit 75): peer lost"),
    ("RestartBudgetExceeded('restart budget exceeded: 4 > 3')", 76, "restart budget exceeded"),
])
def test_fail_stop_exits_with_the_documented_code(make, code, said):
    script = ("from accelpact.errors import *\nfrom accelpact.runtime.fail_stop import fail_stop\n"
              f"fail_stop({make}, on_reject='exit', rank=2)\nprint('not reached')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert said in proc.stderr and "rank 2" in proc.stderr and "not reached" not in proc.stdout


def test_injector_fires_each_fault_once_on_its_rank_and_holds_back_the_targeted_probe():
    inj = FaultInjector("skip@2:committed:1,late@3:backward:0,skip@4:forward:1", rank=1, data_timeout_s=0.01)
    inj.on_phase(1, FailurePhase.COMMITTED)
    assert inj.before_probe("replicate") and inj.before_probe("shard")
    inj.on_phase(2, FailurePhase.COMMITTED)
    assert inj.probe_order(["replicate", "shard"]) == ["shard", "replicate"]  # the target goes last
    assert inj.before_probe("shard") and not inj.before_probe("replicate")
    inj.on_phase(3, FailurePhase.BACKWARD)  # rank 0's fault: nothing here
    with pytest.raises(InjectedFault) as fault:
        inj.on_phase(4, FailurePhase.FORWARD)
    assert fault.value.failure_cause == "injected skip@4:forward:1"
    inj.on_phase(4, FailurePhase.FORWARD)  # once only: a rewound update runs clean


def test_a_boundary_skip_targets_the_rank_own_group_where_it_has_no_replicate_group():
    """A fully sharded job has one "shard" group: the boundary's skip is of its probe (without
    the retarget no probe met it, and it struck in the next forward as a Rewind)."""
    inj = FaultInjector("skip@2:committed:1", rank=1, data_timeout_s=0.01)
    inj.on_phase(2, FailurePhase.COMMITTED)
    assert inj.probe_order(["shard"]) == ["shard"]
    assert not inj.before_probe("shard")
    inj.on_phase(3, FailurePhase.FORWARD)  # met by its probe: nothing left for the next forward


def test_a_kill_or_stall_can_be_planned_inside_a_recovery_and_strikes_at_that_step(monkeypatch):
    from accelpact.faults import injector as injector_module
    from accelpact.faults.plan import RECOVERY_STEPS, FaultPlan

    plan = FaultPlan.parse("kill@5:agree:2,stall@6:rebind:1,skip@5:forward:0")
    assert {str(f) for f in plan.faults} == {"skip@5:forward:0", "kill@5:agree:2", "stall@6:rebind:1"}
    with pytest.raises(ConfigError, match="only kill or stall can strike inside a recovery"):
        FaultPlan.parse("skip@5:agree:2")
    with pytest.raises(ConfigError, match="or a recovery step: guard, agree"):
        FaultPlan.parse("kill@5:elsewhere:2")
    assert RECOVERY_STEPS[:2] == ("guard", "agree")
    struck = []
    monkeypatch.setattr(injector_module, "perform", lambda fault, **kw: struck.append(str(fault)))
    inj = FaultInjector(plan, rank=2, data_timeout_s=0.01)
    inj.on_recovery_step(5, "guard")
    inj.on_recovery_step(4, "agree")
    assert struck == []
    inj.on_recovery_step(5, "agree")
    inj.on_recovery_step(5, "agree")  # once
    assert struck == ["kill@5:agree:2"]


def test_a_kill_at_the_save_strikes_before_the_work_after_that_commit(monkeypatch):
    """`kill@U:save:R`: R committed update U and dies as the work due after it (a checkpoint save,
    a digest check) begins; its peers meet its absence inside that work (`runtime.after_commit`).
    `miss@U:save:R`: R's control plane fails there instead, every process alive."""
    from accelpact.errors import ControlPlaneError
    from accelpact.faults import injector as injector_module
    from accelpact.faults.plan import FaultPlan
    from accelpact.runtime.listeners import tell_before_commit_work

    plan = FaultPlan.parse("kill@4:save:2,miss@6:save:2")
    assert [str(f) for f in plan.faults] == ["kill@4:save:2", "miss@6:save:2"]
    for bad in ("skip@4:save:2", "stall@4:save:2", "late@4:save:2"):
        with pytest.raises(ConfigError, match="only kill or miss can strike at the work after a commit"):
            FaultPlan.parse(bad)
    with pytest.raises(ConfigError, match="or after the commit: save"):
        FaultPlan.parse("kill@4:elsewhere:2")
    struck = []
    monkeypatch.setattr(injector_module, "perform", lambda fault, **kw: struck.append(str(fault)))
    inj = FaultInjector(plan, rank=2, data_timeout_s=0.01)
    tell_before_commit_work([inj], 2)
    inj.on_phase(4, FailurePhase.COMMITTED)  # not at the boundary: after the commit
    assert struck == []
    tell_before_commit_work([inj], 4)
    tell_before_commit_work([inj], 4)  # once
    assert struck == ["kill@4:save:2"]
    with pytest.raises(ControlPlaneError, match="injected miss@6:save:2: the control plane failed on this rank"):
        tell_before_commit_work([inj], 6)  # a miss fails the work here, every process alive
    tell_before_commit_work([inj], 6)


def test_a_kill_or_miss_at_the_boundary_check_strikes_after_the_check_before_the_commit(monkeypatch):
    """`kill@U:check:R` dies with update U finished and its contribution out; `miss@U:check:R` makes
    the check fail on R although it completed (what a rank sees when a peer dies mid-all-reduce)."""
    from accelpact.errors import ControlPlaneError
    from accelpact.faults import injector as injector_module
    from accelpact.faults.plan import FaultPlan
    from accelpact.runtime.listeners import checked

    plan = FaultPlan.parse("kill@3:check:1,miss@3:check:2")
    for bad, why in (("skip@3:check:1", "only kill or miss can strike at the boundary's 'check'"),
                     ("miss@3:forward:1", "a miss strikes at the boundary check or the save only"),
                     ("kill@3:elsewhere:1", "or the boundary's: check")):
        with pytest.raises(ConfigError, match=why):
            FaultPlan.parse(bad)
    killed = []
    monkeypatch.setattr(injector_module, "kill_self", lambda: killed.append(True))
    calls = []
    killer = FaultInjector(plan, rank=1, data_timeout_s=0.01)
    assert checked([killer], 2, lambda: calls.append(2) or 0) == 0 and not killed
    with pytest.raises(ControlPlaneError):  # kill_self returns here only because it is patched
        checked([killer], 3, lambda: calls.append(3) or 0)
    assert killed == [True] and calls == [2, 3]  # the check ran first: the contribution is out
    misser = FaultInjector(plan, rank=2, data_timeout_s=0.01)
    with pytest.raises(ControlPlaneError, match="injected miss@3:check:2: the boundary check of update 3 failed"):
        checked([misser], 3, lambda: 0)
    assert checked([misser], 3, lambda: 0) == 0  # once


def test_the_recovery_driver_tells_the_executor_each_step_it_enters():
    from accelpact.runtime.executor import RecoveryExecutor

    heard = []
    executor = RecoveryExecutor.__new__(RecoveryExecutor)
    executor.update, executor.listeners = 7, (SimpleNamespace(on_recovery_step=lambda u, s: heard.append((u, s))),
                                              SimpleNamespace())  # a listener without the hook is skipped
    executor.before_effect("agree")
    assert heard == [(7, "agree")]


def test_injector_from_the_environment_fires_in_the_first_attempt_only_unless_asked():
    env = {"ACCELPACT_FAULTS": "skip@2:committed:1"}
    kw = dict(rank=1, world_size=4, data_timeout_s=1.0)
    assert FaultInjector.from_env(attempt=0, env=env, **kw) is not None
    assert FaultInjector.from_env(attempt=1, env=env, **kw) is None
    assert FaultInjector.from_env(attempt=1, env={**env, "ACCELPACT_FAULTS_EVERY_ATTEMPT": "1"}, **kw) is not None
    assert FaultInjector.from_env(attempt=0, env={}, **kw) is None
    with pytest.raises(ConfigError, match="ACCELPACT_FAULTS"):
        FaultInjector.from_env(attempt=0, env={"ACCELPACT_FAULTS": "skip@x"}, **kw)
    with pytest.raises(ConfigError, match="out of range"):
        FaultInjector.from_env(attempt=0, env={"ACCELPACT_FAULTS": "skip@2:committed:9"}, **kw)


def test_reject_evidence_names_the_reasons_and_the_original_error(tmp_path):
    try:
        raise KeyError("batch")
    except KeyError as exc:
        error = exc
    record = RecoveryRecord(1, 5, RecoveryAction.REJECT, FailurePhase.BACKWARD, True, "other: batch", 4, 0,
                            reasons=["no pre-step copy"])
    rt = SimpleNamespace(rank=3, attempt=0, opt_step=4)
    found = evidence_of(rt, record, error)
    path = write_reject_evidence(str(tmp_path), found)
    body = json.loads(open(path).read())
    assert body["reasons"] == ["no pre-step copy"] and body["exit_code"] == 75 and body["frontier"] == 4
    assert "KeyError" in body["traceback"] and body["incident"]["action"] == "reject"
    assert body["incident"]["error"]["type"] == "KeyError" and body["incident"]["sentence"].startswith("rank 3 ")
    assert write_reject_evidence(None, found) is None


def test_an_unknown_model_type_is_refused_by_name():
    with pytest.raises(UnsupportedModelError, match="unknown model type Linear"):
        detect_profile(torch.nn.Linear(2, 2))


def test_tau_counts_updates_so_a_step_the_scaler_skipped_does_not_leave_it_behind(monkeypatch):
    """GradScaler skips optimizer.step() when it finds inf gradients (routine while fp16's scale
    settles): no step hook fires, and tau counted one step short for the rest of the run. Every
    later Rewind was then refused ("tau out of range"), and with step_copy a rank that finished
    its update kept its step and stepped again in the re-run."""
    import torch

    from accelpact.runtime import runtime as shell

    monkeypatch.setattr(shell, "record_train", lambda rt: None)
    monkeypatch.setattr(shell, "after_commit", lambda rt: None)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    scaler.scale(torch.ones(()))  # the scaler's state exists once it has scaled a loss
    stepped = []
    opt.register_step_post_hook(lambda *a: stepped.append(1))
    model.weight.grad = torch.full_like(model.weight, float("inf"))  # an fp16 overflow
    model.bias.grad = torch.zeros_like(model.bias)
    scaler.step(opt)
    assert stepped == []  # no optimizer step, so no hook counted it
    rt = SimpleNamespace(frontier=3, opt_step=3, machine=SimpleNamespace(fire=lambda trigger: None),
                         observers=SimpleNamespace(commit=lambda frontier, generation, late_s: None), generation=0)
    shell.Runtime._commit(rt)
    assert rt.frontier == rt.opt_step == 4


def test_a_body_run_to_its_end_counts_in_tau_before_its_boundary_check(monkeypatch):
    """Found by review (trace validation of a Preserve failed): after a step GradScaler skipped,
    tau stayed F through the boundary of update F+1, so a failure found there was recorded with
    tau = F, which no behaviour of the spec has (a finished body is tau = F+1 at its boundary)."""
    from accelpact.runtime import runtime as shell

    seen = {}
    monkeypatch.setattr(shell, "checked_after_links", lambda rt, saw, t: 1)  # a peer needs the recovery
    rt = SimpleNamespace(
        frontier=3, opt_step=3, update_index=4,  # update 4 ran its body; its step was skipped
        deferral=SimpleNamespace(pending=None), _plans_deferred=False, listeners=[], membership=None,
        config=SimpleNamespace(boundary="sync", health_check=False),
        data_plane=SimpleNamespace(uses_nccl=lambda: False))  # gloo: no device fence
    rt._notify = lambda phase: None
    rt._recover = lambda *args: seen.setdefault("tau", rt.opt_step)
    shell.Runtime._boundary(rt, None, None)
    assert seen["tau"] == 4


def _drive_one_rank(phase, *, opt_step: int, **handlers):
    """One recovery of a one-rank world through `drive`: every handler succeeds but those given
    (name -> function of the effect); returns the outcome."""
    from accelpact.fsm import effects as fx
    from accelpact.fsm.decisions import GroupId
    from accelpact.fsm.driver import Observation
    from accelpact.fsm.machine import RecoveryContext, RecoveryMachine
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.recovery import drive

    class OneRank(fx.Executor):
        def quiesce(self, effect):
            return fx.GuardVerdict(True)

        def gather_reports(self, effect):
            return [effect.report]

        def restore_boundary(self, effect):
            return fx.StepResult(True)

        def replace_groups(self, effect):
            return fx.StepResult(True)

        def rebind_references(self, effect):
            return fx.StepResult(True)

        def validate_groups(self, effect):
            return fx.StepResult(True)

        def vote_release(self, effect):
            return "resume" if effect.ok else "reject"

        def force_reject(self, effect):
            return "reject"

    executor = OneRank()
    for name, handler in handlers.items():
        setattr(executor, name, handler)
    group = (GroupId("replicate", (0,)),)
    rewind = {} if phase is FailurePhase.COMMITTED else {"rewind_phases": (phase,), "rerun_ok": True,
                                                          "rerun_reason": ""}
    obs = Observation(rank=0, world_size=1, frontier=3, generation=0, opt_step=opt_step, failure_phase=phase,
                      saw_failure=True, failed_groups=group, cause="timeout", held_groups=group, **rewind)
    machine = RecoveryMachine(RecoveryContext(0))
    machine.fire("commit_update")
    return drive(machine, obs, executor).outcome


def test_a_handler_that_raises_is_its_ranks_vote_not_an_escape_from_the_protocol():
    """Found by review: `drive` called each handler bare. A user's data_state.load_state_dict that
    raised AttributeError inside the Rewind's restore left this rank's machine in Replace, posted no
    vote, and reached the user as a raw error while its peers waited for it in their collectives.
    The handler's error is now its failure value: this rank votes against release, and the recovery
    rejects with the cause named."""
    from accelpact.fsm.phases import FailurePhase, RecoveryAction

    votes = []

    def restore(effect):
        raise AttributeError("'Loader' object has no attribute 'load_state_dict'")

    def vote(effect):
        votes.append((effect.ok, effect.reason))
        return "resume" if effect.ok else "reject"

    outcome = _drive_one_rank(FailurePhase.BACKWARD, opt_step=3, restore_boundary=restore, vote_release=vote)
    assert outcome.action is RecoveryAction.REJECT
    assert votes and votes[0][0] is False and "restore raised AttributeError" in votes[0][1]
    assert any("restore raised AttributeError" in r for r in outcome.reasons), outcome.reasons


def test_a_reject_without_the_protocol_records_the_phase_the_update_failed_in(monkeypatch):
    """Found by review: the record read the phase tracker, which the update had already left, so
    every such reject (a peer killed in backward without spares: the commonest fail-stop) was
    recorded as failed "committed" in its evidence, incident and metrics."""
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime import runtime as shell

    seen = {}
    rt = SimpleNamespace(_recoveries=0, update_index=4, frontier=3, generation=0, history=[],
                         _tracker=SimpleNamespace(phase=None),
                         control=SimpleNamespace(force_reject=lambda epoch, reason: "reject"))
    rt._reject = lambda reasons, error, record: seen.setdefault("record", record)
    shell.Runtime._reject_without_protocol(rt, "control plane failed at the boundary", RuntimeError("x"),
                                           FailurePhase.BACKWARD)
    assert seen["record"].failure_phase is FailurePhase.BACKWARD


def test_a_vote_that_could_not_be_posted_names_its_own_cause_in_the_reject():
    """Found by review: a rank whose vote failed (a broken pipe to the store) forced the reject
    and then recorded "a peer voted against release" in its evidence and incident."""
    from accelpact.fsm import effects as fx
    from accelpact.fsm.phases import FailurePhase, RecoveryAction

    failure = "posting the release vote failed: DistNetworkError: Broken pipe"
    outcome = _drive_one_rank(FailurePhase.COMMITTED, opt_step=4,
                              vote_release=lambda effect: fx.ControlPlaneFailure(failure))
    assert outcome.action is RecoveryAction.REJECT
    assert outcome.reasons == (failure,), outcome.reasons


def test_a_failed_late_discovery_travels_with_the_updates_own_error():
    """Found by review: when FSDP1's first forward failed before its lazy init, the discovery's
    failure was only logged, and the Rewind then failed in rebind with a bare "KeyError: 'shard'"."""
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.late_discovery import discover_late

    def prepare():
        raise KeyError("shard")

    rt = SimpleNamespace(prepare=prepare)
    error = RuntimeError("Connection closed by peer")
    got, phase = discover_late(rt, error, FailurePhase.FORWARD, line_up=False)
    assert got is error and phase is FailurePhase.FORWARD
    assert any("rebind plans could not be discovered: KeyError" in note for note in error.__notes__)


def test_a_line_up_that_fails_after_discovery_rejects_in_the_phase_the_update_failed():
    """Found by review: the reject passed no phase and was recorded as "committed" although update 1
    had failed in forward (the mislabel already fixed at the boundary)."""
    from accelpact.errors import ControlPlaneError
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.late_discovery import discover_late

    def check(flag):
        raise ControlPlaneError("store unreachable")

    rejected = []
    rt = SimpleNamespace(prepare=lambda: None, control=SimpleNamespace(boundary_check=check),
                         _reject_without_protocol=lambda reason, error, phase=None: rejected.append((error, phase)))
    error = RuntimeError("Connection closed by peer")
    discover_late(rt, error, FailurePhase.FORWARD)
    assert rejected == [(error, FailurePhase.FORWARD)]


def test_a_profile_or_platform_override_never_contradicts_what_detection_found(monkeypatch):
    """Found by review: ACCELPACT_PROFILE / ACCELPACT_PLATFORM replaced the envelope's key
    unchecked: a DDP job told "fsdp2-hsdp" obeyed FSDP2's Rewind rows (without the pre-step copy
    DDP's need), and an NCCL job told "cpu-gloo" obeyed rows measured on gloo. An override counts
    only where detection cannot tell."""
    from accelpact.errors import ConfigError, UnsupportedModelError
    from accelpact.runtime import detect

    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(detect, "detect_profile", lambda m: "ddp")
    assert detect.envelope_profile(model, None) == detect.envelope_profile(model, "ddp") == "ddp"
    with pytest.raises(ConfigError, match="is 'fsdp2-hsdp', but the model is 'ddp'"):
        detect.envelope_profile(model, "fsdp2-hsdp")

    def unknown(m):
        raise UnsupportedModelError("unknown model type Linear")

    monkeypatch.setattr(detect, "detect_profile", unknown)
    assert detect.envelope_profile(model, "ddp") == "ddp"  # a wrapper detection does not know
    with pytest.raises(UnsupportedModelError):
        detect.envelope_profile(model, None)

    monkeypatch.setattr(detect, "detect_platform", lambda groups: "cuda-nccl")
    with pytest.raises(ConfigError, match="is 'cpu-gloo', but the data plane runs on 'cuda-nccl'"):
        detect.envelope_platform({}, "cpu-gloo")
    assert detect.envelope_platform({}, None) == "cuda-nccl"
    monkeypatch.setattr(detect, "detect_platform", lambda groups: "cpu:gloo,cuda:gloo+cuda:nccl")
    assert detect.envelope_platform({}, "cuda-nccl") == "cuda-nccl"  # a mix no envelope names: the user's word


def test_the_permissive_envelope_is_named_at_attach():
    """Found by review: a production run with ACCELPACT_ENVELOPE=permissive (every action granted,
    nothing measured) got only an info line."""
    from accelpact.envelope.model import permissive_envelope
    from accelpact.fsm.decisions import envelope_facts, envelope_warning

    facts = envelope_facts(permissive_envelope("cpu-gloo", "fsdp2-hsdp"), "cpu-gloo", "fsdp2-hsdp")
    warning = envelope_warning(facts, "fsdp2-hsdp", "permissive (qualification run)")
    assert warning is not None and "grants every action without a measurement" in warning


def test_only_an_updates_own_optimizer_step_moves_tau():
    """Found by review: a checkpoint save of an optimizer without state (plain SGD) runs
    `optimizer.step()` between updates (DCP's `_init_optim_state`, through `get_state_dict`); the
    step post-hook counted it, tau ran one ahead, and a failure in the next forward was taken for
    one after its step (Reject instead of Rewind)."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.hooks import PhaseTracker

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    phases, steps = [], []
    tracker = PhaseTracker(model, opt, on_phase=phases.append, before_step=lambda: None,
                           after_step=lambda: steps.append(1))
    tracker.begin()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    assert tracker.leave() is FailurePhase.OPTIMIZER and len(steps) == 1
    opt.zero_grad()  # grads None after the update (set_to_none): DCP then steps to make state
    weights = model.weight.detach().clone()
    get_state_dict(model, [opt])  # the save's view of the state: steps an SGD without state
    assert len(steps) == 1 and torch.equal(model.weight, weights)  # a step that changed nothing
    tracker.remove()


def test_a_restore_that_raises_logs_its_traceback_and_votes_its_reason(monkeypatch, caplog):
    """Found by review: the exception became a string in the vote and its traceback was lost (a
    user's `load_state_dict` bug during a Rewind left nothing to debug it with)."""
    from accelpact.fsm.effects import RestoreBoundary
    from accelpact.runtime import discard, restore

    monkeypatch.setattr(discard, "discard_partial_update", lambda model, optimizer: None)

    def broken(data_state):
        raise KeyError("sampler_epoch")

    rewind = SimpleNamespace(snapshot=SimpleNamespace(frontier=4, restore=broken))
    with caplog.at_level("ERROR", logger="accelpact.runtime"):
        result, _ = restore.restore_boundary(None, None, None, rewind, RestoreBoundary(frontier=4, undo_step=False))
    assert not result.ok and result.reason == "KeyError: 'sampler_epoch'"
    (record,) = [r for r in caplog.records if "restoring the boundary of F=4 failed" in r.getMessage()]
    assert record.exc_info and record.exc_info[0] is KeyError


def test_a_step_that_raised_votes_its_reason_and_the_one_it_came_from(monkeypatch, caplog):
    """Found by review: replace and rebind turned the exception into its outer text; c10d re-raises
    gloo's error under its own message, and the gloo one is what says what happened. Both now go
    into the vote, and the traceback into the log."""
    from accelpact.fsm.effects import StepResult
    from accelpact.runtime import replace

    try:
        try:
            raise RuntimeError("Connection closed by peer [10.0.0.2]:4312")
        except RuntimeError as gloo:
            raise ValueError("DistBackendError: c10d failed") from gloo
    except ValueError as exc:
        chained = exc
    assert StepResult.failed(chained, "replacing: ").reason == (
        "replacing: ValueError: DistBackendError: c10d failed (from RuntimeError: Connection closed by peer "
        "[10.0.0.2]:4312)")
    try:
        raise KeyError("x") from None
    except KeyError as exc:
        assert StepResult.failed(exc).reason == "KeyError: 'x'"  # `from None`: nothing else said

    def broken(*args, **kwargs):
        raise chained

    monkeypatch.setattr(replace, "replace_group", broken)
    gid = SimpleNamespace(label="replicate", key="replicate[0,1]", ranks=(0, 1))
    plane = SimpleNamespace(gids={"replicate": gid}, groups={"replicate": object()}, backend_specs={"replicate": "gloo"},
                            timeout_s=1.0, standby=SimpleNamespace(take=lambda label, token: None),
                            replacement_label=lambda label: label)
    effect = SimpleNamespace(groups=(gid,), standby=(), generation=1)
    with caplog.at_level("ERROR", logger="accelpact.runtime"):
        result = replace.replace_groups(plane, 0, effect, {})
    assert not result.ok and "Connection closed by peer" in result.reason
    assert any(r.exc_info and r.exc_info[1] is chained for r in caplog.records)
