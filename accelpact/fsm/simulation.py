"""A deterministic in-memory simulation of N ranks running the real driver over a fake bus.

Used by unit tests and property-based campaigns: the same `run_recovery` generator that the
runtime executes is stepped here, one rank at a time in an order drawn from a seeded RNG, against
a fake control plane with a single compare-and-set outcome register. Each rank's requests are
performed by a `SimExecutor`, which implements the same `Executor` protocol as the runtime's
`RecoveryExecutor` (and decides with the same `decisions` functions), so the simulation covers
effect semantics too. Faults: a report that never
arrives, a crash at a chosen phase, a replacement that cannot be built, a rebind that misses a
reference (so the proof fails), a validation that fails, a frontier/generation/step mismatch.
After every step the protocol's safety properties are checked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..errors import AccelPactError
from .decisions import GroupId, ReleaseVote, decide_release
from .driver import Observation, RecoveryOutcome, run_recovery
from .effects import (
    ControlPlaneFailure,
    Effect,
    Executor,
    ForceReject,
    GatherReports,
    GuardVerdict,
    Quiesce,
    RebindReferences,
    ReplaceGroups,
    RestoreBoundary,
    StepResult,
    ValidateGroups,
    VoteRelease,
    perform,
)
from .machine import RecoveryContext, RecoveryMachine
from .phases import FailurePhase, Phase, RecoveryAction


class InvariantViolation(AccelPactError, AssertionError):
    """A protocol property failed in simulation (the oracle of the campaigns)."""


class WouldBlock(AccelPactError):
    """A simulated effect cannot complete yet (a peer has not posted); the scheduler runs
    another rank. Never escapes `simulate`."""


@dataclass(frozen=True)
class Scenario:
    world_size: int
    failed_group: tuple[int, ...]
    failure_phase: FailurePhase = FailurePhase.COMMITTED
    frontier: int = 5
    generation: int = 0
    observers: tuple[int, ...] | None = None  # ranks that saw the failure (default: failed group)
    frontier_skew: dict[int, int] = field(default_factory=dict)  # rank -> frontier offset
    generation_skew: dict[int, int] = field(default_factory=dict)
    step_skew: dict[int, int] = field(default_factory=dict)  # rank -> optimizer-step offset
    phase_override: dict[int, FailurePhase] = field(default_factory=dict)
    guard_fail: tuple[int, ...] = ()
    lost_reports: tuple[int, ...] = ()  # reports that never reach the bus (sender stays alive)
    crash_at: dict[int, Phase] = field(default_factory=dict)  # rank -> phase where it crashes
    replace_fail: tuple[int, ...] = ()
    rebind_miss: tuple[int, ...] = ()  # ranks whose rebind leaves one reference stale
    validate_fail: tuple[int, ...] = ()
    lost_votes: tuple[int, ...] = ()
    slots: int = 2  # cached references per rank and failed group
    #: Rewind: failure phases every rank's envelope qualifies it for (empty: Rewind is off)
    rewind_phases: tuple[FailurePhase, ...] = ()
    rerun_blocked: tuple[int, ...] = ()  # ranks that cannot re-run the update (no snapshot, ...)
    stepped: tuple[int, ...] = ()  # ranks that applied the interrupted update's step (tau = F+1)
    step_copies: tuple[int, ...] = ()  # ranks holding a host copy of their pre-step state
    restore_fail: tuple[int, ...] = ()  # ranks whose boundary restore fails


@dataclass
class SimRank:
    rank: int
    machine: RecoveryMachine
    gen: object
    refs: list[int]  # generation named by each reference slot
    pending: Effect | None = None
    outcome: RecoveryOutcome | None = None
    crashed: bool = False
    rebound: bool = False
    frontier: int = 0
    generation: int = 0
    base: int = 0  # F committed before the update at hand
    tau: int = 0  # optimizer steps applied
    executor: SimExecutor | None = None


@dataclass
class SimResult:
    outcomes: dict[int, RecoveryOutcome]
    crashed: tuple[int, ...]
    register: str | None
    steps: int
    trace: list[tuple[int, str, str, str]]  # (rank, trigger, from, to) in global order
    #: (rank, trigger of the row last taken, effect performed), in global order
    requests: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def actions(self) -> set[RecoveryAction]:
        return {o.action for o in self.outcomes.values()}


class FakeBus:
    """Control plane: report board, vote board and one compare-and-set outcome register."""

    def __init__(self, world_size: int, lost_reports=(), lost_votes=()):
        self.world_size = world_size
        self.reports: dict[int, object] = {}
        self.votes: dict[int, ReleaseVote] = {}
        self.register: str | None = None
        self.lost_reports = set(lost_reports)
        self.lost_votes = set(lost_votes)

    def compare_set(self, value: str) -> str:
        if self.register is None:
            self.register = value
        return self.register


class SimExecutor(Executor):
    """One simulated rank's executor: the `Executor` protocol against the fake bus.

    A handler that would block raises WouldBlock unless `allow_timeout` is set, which the
    scheduler does only when no rank can progress (then waiting ones time out)."""

    def __init__(self, sim: SimRank, bus: FakeBus, scenario: Scenario):
        self.sim, self.bus, self.sc = sim, bus, scenario
        self.allow_timeout = False

    def quiesce(self, effect: Quiesce) -> GuardVerdict:
        failed = self.sim.rank in self.sc.guard_fail
        return GuardVerdict(not failed, "FSDP unit not idle" if failed else "")

    def gather_reports(self, effect: GatherReports):
        bus, n = self.bus, self.sc.world_size
        if self.sim.rank not in bus.lost_reports:
            bus.reports[self.sim.rank] = effect.report
        if len(bus.reports) == n:
            return [bus.reports.get(r) for r in range(n)]
        if self.allow_timeout:
            return ControlPlaneFailure("timed out gathering reports")
        raise WouldBlock("reports missing")

    def restore_boundary(self, effect: RestoreBoundary) -> StepResult:
        s = self.sim
        if s.rank in self.sc.restore_fail:
            return StepResult(False, "data cursor would not load")
        if effect.undo_step:
            if s.rank not in self.sc.step_copies:
                return StepResult(False, f"tau={s.tau} and no pre-step copy")
            s.tau = effect.frontier  # the copy puts the parameters and tau back
        return StepResult(True)

    def replace_groups(self, effect: ReplaceGroups) -> StepResult:
        ok = self.sim.rank not in self.sc.replace_fail
        return StepResult(ok, "" if ok else "store unreachable")

    def rebind_references(self, effect: RebindReferences) -> StepResult:
        s = self.sim
        s.rebound = True
        for i in range(len(s.refs)):
            if s.rank in self.sc.rebind_miss and i == len(s.refs) - 1:
                continue  # the missed slot stays on the retired generation
            s.refs[i] = effect.generation
        stale = [i for i, g in enumerate(s.refs) if g != effect.generation]
        return StepResult(not stale, f"stale slots {stale}" if stale else "")

    def validate_groups(self, effect: ValidateGroups) -> StepResult:
        ok = self.sim.rank not in self.sc.validate_fail
        return StepResult(ok, "" if ok else "all-reduce sum mismatch")

    def vote_release(self, effect: VoteRelease):
        bus, n = self.bus, self.sc.world_size
        if self.sim.rank not in bus.lost_votes:
            bus.votes[self.sim.rank] = ReleaseVote(self.sim.rank, effect.ok, effect.reason)
        if bus.register is not None:
            return bus.register
        if len(bus.votes) == n:  # rank 0's part: the same decision the runtime's release makes
            ok, _ = decide_release([bus.votes.get(r) for r in range(n)], n)
            return bus.compare_set("resume" if ok else "reject")
        if self.allow_timeout:
            return ControlPlaneFailure("timed out awaiting release")
        raise WouldBlock("votes missing")

    def force_reject(self, effect: ForceReject) -> str:
        return self.bus.compare_set("reject")


def simulate(scenario: Scenario, seed: int = 0, max_steps: int = 10_000) -> SimResult:
    """Run one recovery on every rank, interleaved by `seed`; check invariants at every step."""
    sc = scenario
    bus = FakeBus(sc.world_size, sc.lost_reports, sc.lost_votes)
    rng = random.Random(seed)
    trace: list[tuple[int, str, str, str]] = []
    requests: list[tuple[int, str, str]] = []
    ranks = {r: _start_rank(sc, r, bus, trace) for r in range(sc.world_size)}

    def live() -> list[SimRank]:
        return [s for s in ranks.values() if not s.crashed and s.outcome is None]

    steps = 0
    while live() and steps < max_steps:
        steps += 1
        candidates = live()
        rng.shuffle(candidates)
        # a timeout fires only when no rank can progress
        progressed = _advance_one(candidates, sc, requests, False) or _advance_one(candidates, sc, requests, True)
        _check_invariants(ranks, bus, sc)
        if not progressed:
            break
    if live():
        raise InvariantViolation(f"liveness: ranks {[s.rank for s in live()]} never finished recovery")
    return SimResult(
        {r: s.outcome for r, s in ranks.items() if s.outcome is not None},
        tuple(r for r, s in ranks.items() if s.crashed),
        bus.register,
        steps,
        trace,
        requests,
    )


def _start_rank(sc: Scenario, r: int, bus: FakeBus, trace: list) -> SimRank:
    """Rank r's machine (past its last commit), its observation, its executor, its first request."""
    n = sc.world_size
    group = GroupId("replicate", tuple(sorted(sc.failed_group)))
    observers = set(sc.observers if sc.observers is not None else sc.failed_group)

    def on_edge(trigger, src, dst):
        trace.append((r, trigger, src, dst))

    machine = RecoveryMachine(RecoveryContext(rank=r), on_edge=on_edge)
    machine.fire("commit_update")  # the last boundary before the fault: F committed
    phase = sc.phase_override.get(r, sc.failure_phase) if r in observers else FailurePhase.COMMITTED
    base = sc.frontier + sc.frontier_skew.get(r, 0)
    tau = base + sc.step_skew.get(r, 0) + (1 if r in sc.stepped else 0)
    held = ((group,) if r in group.ranks else ()) + (GroupId("data", tuple(range(n))),)
    obs = Observation(
        rank=r, world_size=n, frontier=base, generation=sc.generation + sc.generation_skew.get(r, 0),
        opt_step=tau, failure_phase=phase, saw_failure=r in observers,
        failed_groups=(group,) if r in observers else (), rewind_phases=sc.rewind_phases,
        rerun_ok=r not in sc.rerun_blocked, rerun_reason="no boundary snapshot" if r in sc.rerun_blocked else "",
        step_copy=r in sc.step_copies, held_groups=held,
    )
    sim = SimRank(r, machine, run_recovery(machine, obs), [sc.generation] * sc.slots, frontier=obs.frontier,
                  generation=obs.generation, base=base, tau=tau)
    sim.executor = SimExecutor(sim, bus, sc)
    sim.pending = next(sim.gen)
    return sim


def _advance_one(candidates: list[SimRank], sc: Scenario, requests: list, allow_timeout: bool) -> bool:
    """Let the first candidate that can progress perform its pending request (or crash)."""
    for s in candidates:
        if s.machine.phase in sc.crash_at.values() and sc.crash_at.get(s.rank) == s.machine.phase:
            s.crashed = True
            return True
        assert s.executor is not None and s.pending is not None
        s.executor.allow_timeout = allow_timeout
        try:
            result = perform(s.executor, s.pending)
        except WouldBlock:
            continue
        requests.append((s.rank, s.machine.taken[-1][0], type(s.pending).__name__))
        try:
            s.pending = s.gen.send(result)
        except StopIteration as stop:
            s.outcome = stop.value
            if s.outcome.resumed:
                s.frontier, s.generation = s.outcome.frontier, s.outcome.generation
        return True
    return False


def _check_invariants(ranks: dict[int, SimRank], bus: FakeBus, sc: Scenario) -> None:
    done = {r: s.outcome for r, s in ranks.items() if s.outcome is not None}
    resumed = {r: o for r, o in done.items() if o.resumed}
    rejected = {r: o for r, o in done.items() if not o.resumed}
    if resumed and rejected:
        raise InvariantViolation(f"OutcomeAgreement: resumed {sorted(resumed)} but rejected {sorted(rejected)}")
    if not resumed:
        return
    if bus.register != "resume":
        raise InvariantViolation("ValidatedBeforeRelease: a rank resumed without the release register")
    if not all(v.ok for v in bus.votes.values()) or len(bus.votes) < sc.world_size:
        raise InvariantViolation("ValidatedBeforeRelease: release without every rank's ok vote")
    kinds = {(o.action, o.frontier, o.generation) for o in resumed.values()}
    if len(kinds) > 1:
        raise InvariantViolation(f"NoSplitFrontier: resumed with {kinds}")
    for r, o in resumed.items():
        s = ranks[r]
        if o.action is RecoveryAction.PRESERVE and o.frontier != s.base + 1:
            raise InvariantViolation(f"ZeroReplay: rank {r} preserved at {o.frontier}, committed {s.base} + 1")
        if o.action is RecoveryAction.REWIND:
            if o.frontier != s.base:
                raise InvariantViolation(f"RewindToFrontier: rank {r} rewound to {o.frontier}, committed {s.base}")
            if s.tau != s.base:
                raise InvariantViolation(f"RewindNeverAfterStep: rank {r} rewound holding tau={s.tau} > F={s.base}")
            if not s.rebound:
                raise InvariantViolation(f"rank {r} rewound without rebuilding its groups")
        if s.rebound:
            stale = [g for g in s.refs if g != o.generation]
            if stale:
                raise InvariantViolation(f"NoStaleReference: rank {r} resumed holding generations {stale}")
