"""The recovery protocol of one rank as a pure generator of effect requests.

The driver decides; it never touches torch, sockets or files. It yields an `Effect` request
(`effects.py`) and is sent back the result, in the style of etcd-raft's `Ready`: the real
runtime's executor performs each request against process groups and the control plane, and the
simulator's executor performs the same requests against a fake bus, so the code that is
simulated and model checked is the code that runs.

Every request is checked against the `effects` column of the table row last taken: the driver
cannot ask for an effect the table does not name for that step (ProtocolError), so the table,
the driver and the trace share one vocabulary.

A control-plane failure inside any effect is signalled by sending back a `ControlPlaneFailure`
value; the driver then forces the single outcome register to "reject" and ends in Reject.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

from .decisions import AgreementDecision, GroupId, RankReport, decide_agreement, must_undo_step
from .effects import (
    ControlPlaneFailure,
    Effect,
    ForceReject,
    GatherReports,
    GuardVerdict,
    OutcomeUnknown,
    Quiesce,
    RebindReferences,
    ReplaceGroups,
    RestoreBoundary,
    StepResult,
    ValidateGroups,
    VoteRelease,
)
from .machine import ProtocolError, RecoveryContext, RecoveryMachine
from .phases import FailurePhase, Phase, RecoveryAction
from .table import effects_of

# ---------------------------------------------------------------------------------- inputs ----


@dataclass(frozen=True)
class Observation:
    """What this rank knows when it enters recovery: facts, reported as they are."""

    rank: int
    world_size: int
    frontier: int  # F: committed updates; the update at hand is F+1
    generation: int
    opt_step: int  # tau, as `decisions.applied_steps` counts it
    failure_phase: FailurePhase
    saw_failure: bool  # True: this rank's own collective failed; False: joined via the control plane
    failed_groups: tuple[GroupId, ...] = ()
    cause: str = ""
    bug: str = ""  # the update raised this, and it is no communication failure ("Type: message")
    preserve_qualified: bool = True
    #: Rewind inputs, reported as they are (see RankReport)
    rewind_phases: tuple[FailurePhase, ...] = ()
    rerun_ok: bool = False
    rerun_reason: str = "this rank cannot re-run an update"
    step_copy: bool = False
    held_groups: tuple[GroupId, ...] = ()
    standby: tuple[tuple[str, int], ...] = ()  # (label, token) of the standbys this rank holds


# --------------------------------------------------------------------------------- outcome ----


@dataclass
class RecoveryOutcome:
    action: RecoveryAction
    frontier: int
    generation: int
    decision: AgreementDecision | None
    reasons: tuple[str, ...] = ()
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    #: the outcome register was unreachable: this rank stopped without claiming an outcome (no
    #: Reject edge); it fail-stops like a Reject, while its peers follow the register
    halted: bool = False

    @property
    def preserved(self) -> bool:
        return self.action is RecoveryAction.PRESERVE

    @property
    def resumed(self) -> bool:
        """Training goes on in this process (Preserve, or Rewind of the interrupted update)."""
        return self.action in (RecoveryAction.PRESERVE, RecoveryAction.REWIND)


RecoveryGen = Generator[Effect, object, RecoveryOutcome]

#: Reasons travel in fixed-size control-plane messages; longer ones are cut.
MAX_REASON = 400


def _as_step(result: object) -> StepResult:
    """A control-plane failure during a repair step counts as that step failing."""
    if isinstance(result, ControlPlaneFailure):
        return StepResult(False, result.reason)
    if not isinstance(result, StepResult):
        raise TypeError(f"expected a StepResult, got {result!r}")
    return result


class _Steps:
    """Fires the table's triggers and admits only the effects the row last taken names."""

    def __init__(self, machine: RecoveryMachine):
        self.machine = machine
        self.trigger = ""

    def fire(self, trigger: str) -> None:
        self.machine.fire(trigger)
        self.trigger = trigger

    def request(self, effect: Effect) -> Effect:
        if type(effect).__name__ not in effects_of(self.trigger):
            raise ProtocolError(f"rank {self.machine.ctx.rank}: {type(effect).__name__} requested after "
                                f"{self.trigger!r}, whose row names {effects_of(self.trigger)}")
        return effect


def run_recovery(machine: RecoveryMachine, obs: Observation) -> RecoveryGen:
    """Drive one rank through observe → guard → agree → replace → rebind → validate → release.

    Returns Preserve (resume at the agreed frontier with generation g+1), Rewind (resume at the
    committed F with generation g+1 and re-run the interrupted update) or Reject.
    """
    return (yield from _Recovery(machine, obs).run())


class _Recovery:
    """One run of the protocol; each phase is a sub-generator of requests."""

    def __init__(self, machine: RecoveryMachine, obs: Observation):
        self.machine, self.obs = machine, obs
        self.ctx: RecoveryContext = machine.ctx
        self.ctx.reset()
        self.start = machine.fired
        self.steps = _Steps(machine)
        self.abort_reason = ""  # why the control plane failed, when this rank aborted
        self.unknown = ""  # why the outcome register was unreachable, when this rank halted
        self.vote_failed = ""  # why this rank's own vote could not be posted or its outcome read

    def done(self, action: RecoveryAction, frontier: int, generation: int, *reasons: str) -> RecoveryOutcome:
        return RecoveryOutcome(action, frontier, generation, self.ctx.decision, tuple(reasons),
                               self.machine.edges_since(self.start))

    def rejected(self, *reasons: str) -> RecoveryOutcome:
        return self.done(RecoveryAction.REJECT, self.obs.frontier, self.obs.generation, *reasons)

    def run(self) -> RecoveryGen:
        obs = self.obs
        self.steps.fire("observe_failure" if obs.saw_failure else "join_recovery")
        report = yield from self.guard()
        decision = yield from self.agree(report)
        if decision is None:  # the control plane failed while gathering: aborted (or halted)
            return self.halted() if self.unknown else self.rejected(self.abort_reason)
        if decision.action is RecoveryAction.REJECT:
            self.steps.fire("decide_reject")
            value = yield self.steps.request(ForceReject("; ".join(decision.reasons)))
            if isinstance(value, OutcomeUnknown):  # every rank decided reject, but none could record it
                self.unknown = value.reason
                out = self.rejected(*decision.reasons, f"the outcome register was unreachable, so the reject "
                                                       f"is not recorded in it ({value.reason})")
                out.halted = True
                return out
            return self.rejected(*decision.reasons)
        assert decision.frontier is not None and decision.generation is not None
        new_generation = decision.generation + 1
        vote = StepResult(True)
        if decision.action is RecoveryAction.REWIND or self.ctx.in_failed_group():  # Rewind: every rank
            vote = yield from self.repair(decision, new_generation)
        else:
            self.steps.fire("stand_by")
        outcome = yield from self.release(vote)
        if self.unknown:
            return self.halted()
        if outcome == "resume":
            self.steps.fire("rewind" if decision.action is RecoveryAction.REWIND else "release")
            self.steps.fire("resume_training")
            return self.done(decision.action, decision.frontier, new_generation)
        self.steps.fire("release_reject")
        return self.rejected(vote.reason or self.vote_failed or "a peer voted against release")

    def guard(self) -> Generator[Effect, object, RankReport]:
        """Quiesce (discarding an interrupted update), then the report for agreement."""
        obs = self.obs
        self.steps.fire("enter_guard")
        verdict = yield self.steps.request(Quiesce(discard=obs.failure_phase is not FailurePhase.COMMITTED,
                                                    failed=tuple(obs.failed_groups)))
        if isinstance(verdict, ControlPlaneFailure):  # pragma: no cover - guard is local
            verdict = GuardVerdict(False, verdict.reason)
        assert isinstance(verdict, GuardVerdict)
        return RankReport(
            rank=obs.rank, frontier=obs.frontier, generation=obs.generation, opt_step=obs.opt_step,
            failure_phase=obs.failure_phase, failed_groups=tuple(obs.failed_groups), guard_ok=verdict.ok,
            guard_reason=verdict.reason[:MAX_REASON], preserve_qualified=obs.preserve_qualified,
            bug=obs.bug[:MAX_REASON],
            rewind_phases=tuple(obs.rewind_phases), rerun_ok=obs.rerun_ok,
            rerun_reason=obs.rerun_reason[:MAX_REASON], step_copy=obs.step_copy, held_groups=tuple(obs.held_groups),
            standby=tuple(obs.standby),
        )

    def agree(self, report: RankReport) -> Generator[Effect, object, AgreementDecision | None]:
        """Frontier agreement; None when the control plane failed (the rank has aborted)."""
        self.steps.fire("submit_report")
        reports = yield self.steps.request(GatherReports(report))
        if isinstance(reports, ControlPlaneFailure):
            self.abort_reason = reports.reason
            if (yield from self.forced_reject(reports.reason)) is not None:
                self.steps.fire("abort")
            return None
        self.ctx.decision = decide_agreement(reports, self.obs.world_size)  # type: ignore[arg-type]
        return self.ctx.decision

    def repair(self, decision: AgreementDecision, generation: int) -> Generator[Effect, object, StepResult]:
        """Replace, rebind, validate this rank's groups (a rewind first restores the boundary);
        returns this rank's vote."""
        rewinding = decision.action is RecoveryAction.REWIND
        mine = tuple(g for g in decision.failed_groups if self.obs.rank in g.ranks)
        self.steps.fire("decide_rewind" if rewinding else "decide_preserve")
        built = StepResult(True)
        if rewinding:
            assert decision.frontier is not None
            undo = must_undo_step(self.obs.opt_step, decision.frontier)
            built = _as_step((yield self.steps.request(RestoreBoundary(decision.frontier, undo_step=undo))))
            if not built.ok:
                built = StepResult(False, f"restoring the boundary snapshot failed: {built.reason}")
        if built.ok:
            built = _as_step((yield self.steps.request(ReplaceGroups(mine, generation, decision.standby_of(mine)))))
        self.ctx.replacement_ok = built.ok
        if not built.ok:
            self.steps.fire("replace_failed")
            return StepResult(False, f"replace failed: {built.reason}")
        self.steps.fire("replace_comm")
        proof = _as_step((yield self.steps.request(RebindReferences(mine, generation))))
        self.ctx.proof_ok = proof.ok
        if not proof.ok:
            self.steps.fire("rebind_failed")
            return StepResult(False, f"rebind proof failed: {proof.reason}")
        self.steps.fire("rebind_refs")
        valid = _as_step((yield self.steps.request(ValidateGroups(mine, generation))))
        return valid if valid.ok else StepResult(False, f"validation failed: {valid.reason}")

    def release(self, vote: StepResult) -> Generator[Effect, object, str]:
        """Vote; follow the single outcome register (forced to reject if the control plane fails)."""
        assert self.machine.phase is Phase.VALIDATE
        outcome = yield self.steps.request(VoteRelease(vote.ok, vote.reason))
        if isinstance(outcome, ControlPlaneFailure):
            self.vote_failed = outcome.reason  # the reject's own cause, not "a peer voted against"
            outcome = yield from self.forced_reject(outcome.reason)
            if outcome is None:
                return "unknown"
        self.ctx.outcome = str(outcome)
        return self.ctx.outcome

    def forced_reject(self, reason: str) -> Generator[Effect, object, str | None]:
        """Control-plane failure: set the outcome register, then follow whatever it says; None when
        it cannot be reached (the rank must not decide alone: it halts)."""
        value = yield self.steps.request(ForceReject(reason))
        if isinstance(value, OutcomeUnknown):
            self.unknown = value.reason
            return None
        self.ctx.outcome = value if isinstance(value, str) else "reject"
        return self.ctx.outcome

    def halted(self) -> RecoveryOutcome:
        """Fail-stop without an outcome: the machine stays where it is, no Reject edge is taken."""
        out = self.rejected(f"outcome register unreachable for the control timeout: stopping without "
                            f"claiming an outcome ({self.unknown})")
        out.halted = True
        return out
