"""A deterministic in-memory simulation of N ranks running the real driver over a fake bus.

Used by unit tests and property-based campaigns: the same `run_recovery` generator that the
runtime executes is stepped here, one rank at a time in an order drawn from a seeded RNG, against
a fake control plane with a single compare-and-set outcome register. Faults: a report that never
arrives, a crash at a chosen phase, a replacement that cannot be built, a rebind that misses a
reference (so the proof fails), a validation that fails, a frontier/generation/step mismatch.
After every step the protocol's safety properties are checked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .decisions import GroupId, ReleaseVote, decide_release
from .driver import (
    ControlPlaneFailure,
    Effect,
    ForceReject,
    GatherReports,
    GuardVerdict,
    Observation,
    Quiesce,
    RebindReferences,
    RecoveryOutcome,
    ReplaceGroups,
    RestoreBoundary,
    StepResult,
    ValidateGroups,
    VoteRelease,
    run_recovery,
)
from .machine import RecoveryContext, RecoveryMachine
from .phases import FailurePhase, Phase, RecoveryAction


class InvariantViolation(AssertionError):
    pass


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


@dataclass
class SimResult:
    outcomes: dict[int, RecoveryOutcome]
    crashed: tuple[int, ...]
    register: str | None
    steps: int
    trace: list[tuple[int, str, str, str]]  # (rank, trigger, from, to) in global order

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


def simulate(scenario: Scenario, seed: int = 0, max_steps: int = 10_000) -> SimResult:
    """Run one recovery on every rank, interleaved by `seed`; check invariants at every step."""
    sc = scenario
    n = sc.world_size
    group = GroupId("replicate", tuple(sorted(sc.failed_group)))
    observers = set(sc.observers if sc.observers is not None else sc.failed_group)
    bus = FakeBus(n, sc.lost_reports, sc.lost_votes)
    rng = random.Random(seed)
    trace: list[tuple[int, str, str, str]] = []
    ranks: dict[int, SimRank] = {}

    for r in range(n):
        ctx = RecoveryContext(rank=r)

        def on_edge(trigger, src, dst, r=r):
            trace.append((r, trigger, src, dst))

        machine = RecoveryMachine(ctx, on_edge=on_edge)
        phase = sc.phase_override.get(r, sc.failure_phase) if r in observers else FailurePhase.COMMITTED
        base = sc.frontier + sc.frontier_skew.get(r, 0)
        tau = base + sc.step_skew.get(r, 0) + (1 if r in sc.stepped else 0)
        held = (group,) if r in group.ranks else ()
        held += (GroupId("data", tuple(range(n))),)
        obs = Observation(
            rank=r,
            world_size=n,
            # a rank at a committed boundary counts the update at hand (F+1 if it commits)
            frontier=base + (1 if phase is FailurePhase.COMMITTED else 0),
            generation=sc.generation + sc.generation_skew.get(r, 0),
            opt_step=tau,
            failure_phase=phase,
            saw_failure=r in observers,
            failed_groups=(group,) if r in observers else (),
            base_frontier=base,
            rewind_phases=sc.rewind_phases,
            rerun_ok=r not in sc.rerun_blocked,
            rerun_reason="no boundary snapshot" if r in sc.rerun_blocked else "",
            step_copy=r in sc.step_copies,
            held_groups=held,
        )
        refs = [sc.generation] * sc.slots
        sim = SimRank(r, machine, run_recovery(machine, obs), refs, frontier=obs.frontier,
                      generation=obs.generation, base=base, tau=tau)
        sim.pending = next(sim.gen)
        ranks[r] = sim

    def live() -> list[SimRank]:
        return [s for s in ranks.values() if not s.crashed and s.outcome is None]

    def resolve(s: SimRank, eff: Effect, allow_timeout: bool):
        """Return (ready, result) for effect `eff` of rank s."""
        if isinstance(eff, Quiesce):
            return True, GuardVerdict(s.rank not in sc.guard_fail, "FSDP unit not idle" if s.rank in sc.guard_fail else "")
        if isinstance(eff, RestoreBoundary):
            if s.rank in sc.restore_fail:
                return True, StepResult(False, "data cursor would not load")
            if s.tau != eff.frontier:
                if s.rank not in sc.step_copies:
                    return True, StepResult(False, f"tau={s.tau} and no pre-step copy")
                s.tau = eff.frontier  # the copy puts the parameters and tau back
            return True, StepResult(True)
        if isinstance(eff, GatherReports):
            if s.rank not in bus.lost_reports:
                bus.reports[s.rank] = eff.report
            if len(bus.reports) == n:
                return True, [bus.reports.get(r) for r in range(n)]
            if allow_timeout:
                return True, ControlPlaneFailure("timed out gathering reports")
            return False, None
        if isinstance(eff, ReplaceGroups):
            ok = s.rank not in sc.replace_fail
            return True, StepResult(ok, "" if ok else "store unreachable")
        if isinstance(eff, RebindReferences):
            s.rebound = True
            for i in range(len(s.refs)):
                if s.rank in sc.rebind_miss and i == len(s.refs) - 1:
                    continue  # the missed slot stays on the retired generation
                s.refs[i] = eff.generation
            stale = [i for i, g in enumerate(s.refs) if g != eff.generation]
            return True, StepResult(not stale, f"stale slots {stale}" if stale else "")
        if isinstance(eff, ValidateGroups):
            ok = s.rank not in sc.validate_fail
            return True, StepResult(ok, "" if ok else "all-reduce sum mismatch")
        if isinstance(eff, VoteRelease):
            if s.rank not in bus.lost_votes:
                bus.votes[s.rank] = ReleaseVote(s.rank, eff.ok, eff.reason)
            if bus.register is not None:
                return True, bus.register
            if len(bus.votes) == n:
                ok, _ = decide_release([bus.votes.get(r) for r in range(n)], n)
                return True, bus.compare_set("resume" if ok else "reject")
            if allow_timeout:
                return True, ControlPlaneFailure("timed out awaiting release")
            return False, None
        if isinstance(eff, ForceReject):
            return True, bus.compare_set("reject")
        raise TypeError(f"unknown effect {eff!r}")

    steps = 0
    while live() and steps < max_steps:
        steps += 1
        candidates = live()
        rng.shuffle(candidates)
        progressed = False
        for allow_timeout in (False, True):  # a timeout fires only when no rank can progress
            for s in candidates:
                if s.machine.phase in sc.crash_at.values() and sc.crash_at.get(s.rank) == s.machine.phase:
                    s.crashed = True
                    progressed = True
                    break
                ready, result = resolve(s, s.pending, allow_timeout)
                if not ready:
                    continue
                try:
                    s.pending = s.gen.send(result)
                except StopIteration as stop:
                    s.outcome = stop.value
                    if s.outcome.resumed:
                        s.frontier, s.generation = s.outcome.frontier, s.outcome.generation
                progressed = True
                break
            if progressed:
                break
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
    )


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
