"""The recovery protocol of one rank as a pure generator of effect requests.

The driver decides; it never touches torch, sockets or files. It yields an `Effect` request and
is sent back the result, in the style of etcd-raft's `Ready`: the real runtime executes each
request against process groups and the control plane, and the simulator (`simulation.py`)
executes the same requests against a fake bus, so the code that is simulated and model checked
is the code that runs.

A control-plane failure inside any effect is signalled by sending back a `ControlPlaneFailure`
value; the driver then forces the single outcome register to "reject" and ends in Reject.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

from .decisions import AgreementDecision, GroupId, RankReport, decide_agreement
from .machine import RecoveryContext, RecoveryMachine
from .phases import FailurePhase, Phase, RecoveryAction

# ---------------------------------------------------------------------------------- inputs ----


@dataclass(frozen=True)
class Observation:
    """What this rank knows when it enters recovery."""

    rank: int
    world_size: int
    frontier: int
    generation: int
    opt_step: int
    failure_phase: FailurePhase
    saw_failure: bool  # True: this rank's own collective failed; False: joined via the control plane
    failed_groups: tuple[GroupId, ...] = ()
    cause: str = ""
    #: F committed before the update at hand (None: `frontier`); what a Rewind returns to
    base_frontier: int | None = None
    #: Rewind inputs, reported as they are (see RankReport)
    rewind_phases: tuple[FailurePhase, ...] = ()
    rerun_ok: bool = False
    rerun_reason: str = "this rank cannot re-run an update"
    step_copy: bool = False
    held_groups: tuple[GroupId, ...] = ()


# --------------------------------------------------------------------------------- effects ----


@dataclass(frozen=True)
class Effect:
    """Base class of the requests the driver yields."""


@dataclass(frozen=True)
class Quiesce(Effect):
    """Guard: flush device work, check every FSDP unit idle. Result: GuardVerdict.

    With `discard` (this rank's update was interrupted) the partial update is thrown away first
    (gradients, unsharded parameters, pending collectives): either the update is rewound or the
    process restarts, and in both cases nothing of it may survive."""

    discard: bool = False


@dataclass(frozen=True)
class RestoreBoundary(Effect):
    """Rewind: drop this rank's partial update, undo an applied step from the pre-step copy,
    restore the boundary snapshot of F (RNG, data cursor). Result: StepResult."""

    frontier: int


@dataclass(frozen=True)
class GatherReports(Effect):
    """Frontier agreement: post this report, receive every rank's (None where missing)."""

    report: RankReport


@dataclass(frozen=True)
class ReplaceGroups(Effect):
    """Retire the failed groups this rank belongs to; build identical-membership replacements
    at `generation`. Result: StepResult."""

    groups: tuple[GroupId, ...]
    generation: int


@dataclass(frozen=True)
class RebindReferences(Effect):
    """Redirect every cached reference to the replacements, then prove none names a retired
    group. Result: StepResult (ok = proof passed)."""

    groups: tuple[GroupId, ...]
    generation: int


@dataclass(frozen=True)
class ValidateGroups(Effect):
    """Integer all-reduce on each replacement, result checked. Result: StepResult."""

    groups: tuple[GroupId, ...]
    generation: int


@dataclass(frozen=True)
class VoteRelease(Effect):
    """Post this rank's release vote and wait for the single outcome register.
    Result: "resume" | "reject"."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class ForceReject(Effect):
    """Write "reject" into the outcome register if it is still empty. Result: the register's
    value afterwards ("reject", or "resume" if the release was already decided)."""

    reason: str


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class StepResult:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class ControlPlaneFailure:
    """Sent back instead of a result when the control plane timed out or a peer vanished."""

    reason: str


# --------------------------------------------------------------------------------- outcome ----


@dataclass
class RecoveryOutcome:
    action: RecoveryAction
    frontier: int
    generation: int
    decision: AgreementDecision | None
    reasons: tuple[str, ...] = ()
    edges: list[tuple[str, str, str]] = field(default_factory=list)

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


def run_recovery(machine: RecoveryMachine, obs: Observation) -> RecoveryGen:
    """Drive one rank through observe → guard → agree → replace → rebind → validate → release.

    Returns Preserve (resume at the agreed frontier with generation g+1), Rewind (resume at the
    committed F with generation g+1 and re-run the interrupted update) or Restart (reject).
    """
    ctx: RecoveryContext = machine.ctx
    ctx.reset()
    start = len(machine.taken)

    def done(action: RecoveryAction, frontier: int, generation: int, *reasons: str) -> RecoveryOutcome:
        return RecoveryOutcome(action, frontier, generation, ctx.decision, tuple(reasons), machine.taken[start:])

    def forced_reject(reason: str):
        """Control-plane failure: set the outcome register, then follow whatever it says."""
        value = yield ForceReject(reason)
        ctx.outcome = value if isinstance(value, str) else "reject"
        return ctx.outcome

    machine.fire("observe_failure" if obs.saw_failure else "join_recovery")

    # -- guard ------------------------------------------------------------------------------
    machine.fire("enter_guard")
    verdict = yield Quiesce(discard=obs.failure_phase is not FailurePhase.COMMITTED)
    if isinstance(verdict, ControlPlaneFailure):  # pragma: no cover - guard is local
        verdict = GuardVerdict(False, verdict.reason)
    assert isinstance(verdict, GuardVerdict)
    report = RankReport(
        rank=obs.rank,
        frontier=obs.frontier,
        generation=obs.generation,
        opt_step=obs.opt_step,
        failure_phase=obs.failure_phase,
        failed_groups=tuple(obs.failed_groups),
        guard_ok=verdict.ok,
        guard_reason=verdict.reason[:MAX_REASON],
        base_frontier=obs.base_frontier,
        rewind_phases=tuple(obs.rewind_phases),
        rerun_ok=obs.rerun_ok,
        rerun_reason=obs.rerun_reason[:MAX_REASON],
        step_copy=obs.step_copy,
        held_groups=tuple(obs.held_groups),
    )

    # -- frontier agreement -----------------------------------------------------------------
    machine.fire("submit_report")
    reports = yield GatherReports(report)
    if isinstance(reports, ControlPlaneFailure):
        yield from forced_reject(reports.reason)
        machine.fire("abort")
        return done(RecoveryAction.REJECT, obs.frontier, obs.generation, reports.reason)
    decision = decide_agreement(reports, obs.world_size)  # type: ignore[arg-type]
    ctx.decision = decision
    if decision.action is RecoveryAction.REJECT:
        yield ForceReject("; ".join(decision.reasons))
        machine.fire("decide_reject")
        return done(RecoveryAction.REJECT, obs.frontier, obs.generation, *decision.reasons)

    assert decision.frontier is not None and decision.generation is not None
    new_generation = decision.generation + 1
    mine = tuple(g for g in decision.failed_groups if obs.rank in g.ranks)
    vote_ok, vote_reason = True, ""

    rewinding = decision.action is RecoveryAction.REWIND
    if ctx.in_failed_group():
        machine.fire("decide_rewind" if rewinding else "decide_preserve")
        # -- replace (a rewind first throws the interrupted update away) --------------------
        built = StepResult(True)
        if rewinding:
            built = _as_step((yield RestoreBoundary(decision.frontier)))
            if not built.ok:
                built = StepResult(False, f"restoring the boundary snapshot failed: {built.reason}")
        if built.ok:
            built = _as_step((yield ReplaceGroups(mine, new_generation)))
        ctx.replacement_ok = built.ok
        if not built.ok:
            machine.fire("replace_failed")
            vote_ok, vote_reason = False, f"replace failed: {built.reason}"
        else:
            machine.fire("replace_comm")
            # -- rebind ---------------------------------------------------------------------
            proof = _as_step((yield RebindReferences(mine, new_generation)))
            ctx.proof_ok = proof.ok
            if not proof.ok:
                machine.fire("rebind_failed")
                vote_ok, vote_reason = False, f"rebind proof failed: {proof.reason}"
            else:
                machine.fire("rebind_refs")
                # -- validate ---------------------------------------------------------------
                valid = _as_step((yield ValidateGroups(mine, new_generation)))
                if not valid.ok:
                    vote_ok, vote_reason = False, f"validation failed: {valid.reason}"
    else:
        machine.fire("stand_by")

    # -- release (single outcome register) ------------------------------------------------------
    assert machine.phase is Phase.VALIDATE
    outcome = yield VoteRelease(vote_ok, vote_reason)
    if isinstance(outcome, ControlPlaneFailure):
        outcome = yield from forced_reject(outcome.reason)
    ctx.outcome = str(outcome)
    if ctx.outcome == "resume":
        machine.fire("rewind" if rewinding else "release")
        machine.fire("resume_training")
        return done(decision.action, decision.frontier, new_generation)
    machine.fire("release_reject")
    return done(RecoveryAction.REJECT, obs.frontier, obs.generation, vote_reason or "a peer voted against release")
