"""Pure decision functions of the protocol: no torch, no I/O, deterministic.

Every rank can run these on the same gathered inputs and reach the same answer; in the runtime
rank 0 runs them and publishes the result through the control plane's single outcome register,
so that even a non-deterministic input order could not split the ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..envelope.model import CONDITIONS, Envelope, ObservationKey, UnknownObservationKey
from .phases import FailurePhase, RecoveryAction


@dataclass(frozen=True, order=True)
class GroupId:
    """A data-plane group named by what it is, independent of its c10d name or generation."""

    label: str
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError(f"group {self.label!r} has no members")
        if tuple(sorted(set(self.ranks))) != tuple(self.ranks):
            raise ValueError(f"group {self.label!r} ranks must be sorted and unique: {self.ranks}")
        # A tuple does not keep its hash: sets of the groups of W reports hashed W copies of a
        # W-rank tuple (W² per agreement, 25 ms at 1,024 ranks). The hash is kept here, and
        # `parse` hands out one object per key, so equal groups also compare by identity.
        object.__setattr__(self, "_hash", hash((self.label, self.ranks)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # rebuilt in the receiving process: a str's hash differs between processes
        return (GroupId, (self.label, self.ranks))

    @property
    def key(self) -> str:
        """`label[r0,r1,...]`; a group of more than 8 ranks writes runs of evenly spaced ranks as
        `first..last` or `first..last:step`, so that a 1,000-rank group fits a report."""
        if len(self.ranks) <= COMPACT_ABOVE:
            return f"{self.label}[{','.join(map(str, self.ranks))}]"
        return f"{self.label}[{','.join(_runs(self.ranks))}]"

    @classmethod
    def parse(cls, key: str) -> GroupId:
        """The group a key names; one object per key (W reports name the same groups)."""
        return _parse_key(key) if cls is GroupId else cls._parse(key)

    @classmethod
    def _parse(cls, key: str) -> GroupId:
        label, _, rest = key.partition("[")
        if not rest.endswith("]"):
            raise ValueError(f"malformed group key {key!r}; expected label[r0,r1,...]")
        ranks: list[int] = []
        for item in filter(None, rest[:-1].split(",")):
            first, dots, tail = item.partition("..")
            if not dots:
                ranks.append(int(item))
                continue
            last, _, step = tail.partition(":")
            if int(step or 1) <= 0:
                raise ValueError(f"malformed group key {key!r}: step of {item!r} must be positive")
            ranks.extend(range(int(first), int(last) + 1, int(step or 1)))
        return cls(label, tuple(ranks))


@functools.lru_cache(maxsize=4096)
def _parse_key(key: str) -> GroupId:
    return GroupId._parse(key)


#: Groups up to this size keep the plain rank list in their key (what traces and people read).
COMPACT_ABOVE = 8


def _runs(ranks: tuple[int, ...]) -> list[str]:
    """Sorted ranks as maximal runs with one step: 'a..b' (step 1), 'a..b:s', or single ranks."""
    out, i = [], 0
    while i < len(ranks):
        j = i + 1
        if j < len(ranks):
            step = ranks[j] - ranks[i]
            while j + 1 < len(ranks) and ranks[j + 1] - ranks[j] == step:
                j += 1
            if j - i >= 2:  # three or more evenly spaced ranks
                out.append(f"{ranks[i]}..{ranks[j]}" + (f":{step}" if step != 1 else ""))
                i = j + 1
                continue
        out.append(str(ranks[i]))
        i += 1
    return out


@dataclass(frozen=True)
class RankReport:
    """What one rank contributes to frontier agreement."""

    rank: int
    #: F: the committed frontier, updates committed before the update at hand (F+1). A report
    #: with phase `committed` says update F+1 finished on this rank; Preserve then commits it.
    frontier: int
    generation: int  # g: communicator generation
    opt_step: int  # tau: optimizer steps applied, as `applied_steps` counts them
    failure_phase: FailurePhase  # phi as seen by this rank (committed for ranks that only joined)
    failed_groups: tuple[GroupId, ...] = ()
    guard_ok: bool = True
    guard_reason: str = ""
    #: whether this rank's envelope qualifies Preserve at a committed boundary (a fact read from
    #: the envelope; `decide_agreement` applies it)
    preserve_qualified: bool = True
    #: the update raised something that is not a communication failure ("Type: message"), or ""
    bug: str = ""
    #: Rewind inputs: failure phases this rank's envelope qualifies Rewind for; whether this
    #: rank can re-run the update from its boundary snapshot (and why not); whether it holds a
    #: host copy of its pre-step state; every data-plane group it holds (a Rewind rebuilds all).
    rewind_phases: tuple[FailurePhase, ...] = ()
    rerun_ok: bool = False
    rerun_reason: str = ""
    step_copy: bool = False
    held_groups: tuple[GroupId, ...] = ()
    #: (label, token) of each standby successor this rank holds, connected and unused
    #: (`comm.standby`); `agreed_standbys` picks the groups every member can adopt one for
    standby: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "frontier": self.frontier,
            "generation": self.generation,
            "opt_step": self.opt_step,
            "failure_phase": str(self.failure_phase),
            "failed_groups": [g.key for g in self.failed_groups],
            "guard_ok": self.guard_ok,
            "guard_reason": self.guard_reason,
            "preserve_qualified": self.preserve_qualified,
            "bug": self.bug,
            "rewind_phases": [str(p) for p in self.rewind_phases],
            "rerun_ok": self.rerun_ok,
            "rerun_reason": self.rerun_reason,
            "step_copy": self.step_copy,
            "held_groups": [g.key for g in self.held_groups],
            "standby": [[label, token] for label, token in self.standby],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> RankReport:
        return cls(
            rank=int(d["rank"]),
            frontier=int(d["frontier"]),
            generation=int(d["generation"]),
            opt_step=int(d["opt_step"]),
            failure_phase=FailurePhase.parse(d["failure_phase"]),
            failed_groups=tuple(GroupId.parse(k) for k in d.get("failed_groups", ())),
            guard_ok=bool(d.get("guard_ok", True)),
            guard_reason=str(d.get("guard_reason", "")),
            preserve_qualified=bool(d.get("preserve_qualified", True)),
            bug=str(d.get("bug", "")),
            rewind_phases=tuple(FailurePhase.parse(p) for p in d.get("rewind_phases", ())),
            rerun_ok=bool(d.get("rerun_ok", False)),
            rerun_reason=str(d.get("rerun_reason", "")),
            step_copy=bool(d.get("step_copy", False)),
            held_groups=tuple(GroupId.parse(k) for k in d.get("held_groups", ())),
            standby=tuple((str(label), int(token)) for label, token in d.get("standby", ())),
        )


@dataclass(frozen=True)
class AgreementDecision:
    """The one decision of frontier agreement, identical on every rank."""

    action: RecoveryAction
    #: the committed frontier training resumes at: F+1 after Preserve (the failed boundary's
    #: update commits), F after Rewind (update F+1 runs again); None after Reject
    frontier: int | None
    generation: int | None
    failed_groups: tuple[GroupId, ...] = ()
    reasons: tuple[str, ...] = field(default=())
    #: (group key, token): the groups to rebuild whose successor every member adopts from the
    #: standby of that token (`agreed_standbys`); the others are built afresh
    standby: tuple[tuple[str, int], ...] = ()

    @property
    def repair_ranks(self) -> frozenset[int]:
        """R: ranks that are members of some failed group and so take part in replace/rebind."""
        return frozenset(r for g in self.failed_groups for r in g.ranks)

    def in_failed_group(self, rank: int) -> bool:
        return rank in self.repair_ranks

    def standby_of(self, groups: Iterable[GroupId]) -> tuple[tuple[str, int], ...]:
        """The agreed (key, token) standbys among `groups` (a rank's own)."""
        keys = {g.key for g in groups}
        return tuple((key, token) for key, token in self.standby if key in keys)

    def to_dict(self) -> dict:
        return {
            "action": str(self.action),
            "frontier": self.frontier,
            "generation": self.generation,
            "failed_groups": [g.key for g in self.failed_groups],
            "reasons": list(self.reasons),
            "standby": [[key, token] for key, token in self.standby],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> AgreementDecision:
        return cls(
            action=RecoveryAction(d["action"]),
            frontier=d["frontier"],
            generation=d["generation"],
            failed_groups=tuple(GroupId.parse(k) for k in d.get("failed_groups", ())),
            reasons=tuple(d.get("reasons", ())),
            standby=tuple((str(key), int(token)) for key, token in d.get("standby", ())),
        )


def _reject(*reasons: str) -> AgreementDecision:
    return AgreementDecision(RecoveryAction.REJECT, None, None, (), tuple(reasons))


def applied_steps(opt_step: int, frontier: int, failure_phase: FailurePhase) -> int:
    """tau as agreement must count it. A failure inside optimizer.step() may leave the step half
    applied, so it counts as applied: the rank is then seen as ahead, and only a pre-step copy
    can put it back."""
    if failure_phase is FailurePhase.OPTIMIZER:
        return max(opt_step, frontier + 1)
    return opt_step


def must_undo_step(opt_step: int, frontier: int) -> bool:
    """Whether a rank rewinding to `frontier` holds a step it must put back from its copy."""
    return opt_step != frontier


@dataclass(frozen=True)
class RerunFacts:
    """What one rank knows about re-running the update in flight (reported, not judged)."""

    frontier: int  # F committed before the update at hand
    update: int  # index of the update at hand (1-based, this process)
    failure_phase: FailurePhase
    in_step: bool  # the update runs inside rt.step(fn), whose body can run again
    snapshot_frontier: int | None  # F of the boundary snapshot held (None: none)
    snapshot_problem: str = ""  # why no snapshot could be taken
    has_data_cursor: bool = False
    rewinds: int = 0  # rewinds of this update so far
    max_rewinds: int = 3
    #: why DDP's gradient buckets could not be isolated from a late all-reduce ('' if they were)
    unisolated_ddp: str = ""


def may_rerun(f: RerunFacts) -> tuple[bool, str]:
    """Whether this rank could re-run the update in flight from its boundary snapshot, and why not."""
    if f.failure_phase is FailurePhase.BACKWARD and f.unisolated_ddp:
        return False, f.unisolated_ddp
    if not f.in_step:
        return False, "the update ran in `with rt.update()`, whose body cannot be re-run (use rt.step(fn))"
    if f.snapshot_frontier != f.frontier:
        return False, f"no boundary snapshot of F={f.frontier} {f.snapshot_problem}".strip()
    if not f.has_data_cursor:
        return False, "no data cursor (pass data_state= to attach) so a re-run could read another batch"
    if f.rewinds >= f.max_rewinds:
        return False, f"update {f.update} was already rewound {f.rewinds} time(s) (max_rewinds_per_update)"
    return True, ""


def decide_agreement(
    reports: Iterable[RankReport | None],
    world_size: int,
    *,
    protected_groups: Iterable[str] = ("control",),
) -> AgreementDecision:
    """Frontier agreement. Preserve only if every rank reported, all at a committed boundary,
    all guards passed, all agree on F, g and tau, and every rank's envelope qualifies it. Rewind if the update was interrupted and
    every rank can discard and re-run it (`_decide_rewind`). Otherwise Restart (fail-stop).

    `reports` may contain None for ranks whose report never arrived (missing → reject).
    """
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    by_rank: dict[int, RankReport] = {}
    reasons: list[str] = []
    for rep in reports:
        if rep is None:
            continue
        if not 0 <= rep.rank < world_size:
            reasons.append(f"report from rank {rep.rank} outside world of size {world_size}")
            continue
        if rep.rank in by_rank and by_rank[rep.rank] != rep:
            reasons.append(f"rank {rep.rank} reported twice with different contents")
        by_rank[rep.rank] = rep
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing:
        reasons.append(f"missing reports from ranks {missing}")
    if reasons:
        return _reject(*reasons)

    ordered = [by_rank[r] for r in range(world_size)]
    bugs = [f"rank {r.rank} raised {r.bug} in update {r.frontier + 1}: not a communication failure, so it is "
            "not recovered (a rebuild cannot fix it, a rewind would run into it again)" for r in ordered if r.bug]
    if bugs:
        return _reject(*bugs)
    protected = set(protected_groups)
    uncommitted = [r.rank for r in ordered if r.failure_phase is not FailurePhase.COMMITTED]
    if uncommitted:
        return _decide_rewind(ordered, uncommitted, world_size, protected)

    for r in ordered:
        if not r.guard_ok:
            reasons.append(f"guard failed on rank {r.rank}: {r.guard_reason or 'unspecified'}")
    unqualified = [r.rank for r in ordered if not r.preserve_qualified]
    if unqualified:
        reasons.append(f"envelope does not qualify preserve at a committed boundary on ranks {unqualified}")
    for name, attr in (("frontier F", "frontier"), ("generation g", "generation"), ("optimizer step tau", "opt_step")):
        values = {getattr(r, attr) for r in ordered}
        if len(values) > 1:
            detail = ", ".join(f"r{r.rank}={getattr(r, attr)}" for r in ordered)
            reasons.append(f"{name} mismatch: {detail}")
    failed = tuple(sorted({g for r in ordered for g in r.failed_groups}))
    if not failed:
        reasons.append("no rank reported a failed data-plane group: nothing to repair")
    reasons += _unreplaceable(failed, world_size, protected)
    if reasons:
        return _reject(*reasons)
    return AgreementDecision(RecoveryAction.PRESERVE, ordered[0].frontier + 1, ordered[0].generation, failed, (),
                             agreed_standbys(failed, ordered))


def agreed_standbys(groups: Iterable[GroupId], ordered: Sequence[RankReport]) -> tuple[tuple[str, int], ...]:
    """(key, token) of each group whose every member reported a standby of that one token: those
    are adopted, the others built afresh. Why all or none: a member that adopts and one that builds
    would each wait for the other's connections until the data timeout. Why one token: a member
    whose last standby build failed still holds an older one, connected to other peers' sockets.
    `ordered` is indexed by rank (every member's report is there: agreement checked it)."""
    held = [dict(r.standby) for r in ordered]
    agreed = []
    for g in groups:
        tokens = {held[m].get(g.label) for m in g.ranks}
        if len(tokens) == 1 and (token := tokens.pop()) is not None:
            agreed.append((g.key, token))
    return tuple(agreed)


def _unreplaceable(groups: Iterable[GroupId], world_size: int, protected: set[str]) -> list[str]:
    reasons = []
    for g in groups:
        if g.label in protected:
            reasons.append(f"group {g.key} is part of the control plane and cannot be replaced in-band")
        if any(not 0 <= m < world_size for m in g.ranks):
            reasons.append(f"group {g.key} names ranks outside the world of size {world_size}")
    return reasons


def _decide_rewind(
    ordered: Sequence[RankReport], uncommitted: list[int], world_size: int, protected: set[str]
) -> AgreementDecision:
    """An update was interrupted. Rewind (discard it everywhere and re-run it from F) only if every
    rank can: the same committed F and g, no rank left with an applied step it cannot undo
    (tau == F, or a pre-step copy puts it back), Rewind qualified for every phase that failed on
    every rank's envelope, and every rank able to re-run the update from its snapshot."""
    phases = sorted({str(r.failure_phase) for r in ordered if r.failure_phase is not FailurePhase.COMMITTED})
    reasons = [f"failure outside a committed boundary on ranks {uncommitted} (phase {phases})"]
    blockers: list[str] = []
    for name, values in (("frontier F", [r.frontier for r in ordered]), ("generation g", [r.generation for r in ordered])):
        if len(set(values)) > 1:
            blockers.append(f"{name} mismatch: " + ", ".join(f"r{r.rank}={v}" for r, v in zip(ordered, values)))
    base = ordered[0].frontier
    stepped = [r.rank for r in ordered if r.opt_step == r.frontier + 1]
    odd = [r.rank for r in ordered if r.opt_step not in (r.frontier, r.frontier + 1)]
    if odd:
        blockers.append("optimizer step tau out of range: " + ", ".join(f"r{r.rank}={r.opt_step}" for r in ordered))
    uncopied = [r for r in stepped if not ordered[r].step_copy]
    if uncopied:
        applied = set(stepped)
        clean = [r.rank for r in ordered if r.rank not in applied]
        what = (f"split optimizer step: ranks {stepped} applied (or began) update {base + 1}, ranks {clean} did not"
                if clean else f"every rank applied (or began) update {base + 1}")
        blockers.append(f"{what}; no pre-step copy on ranks {uncopied}, so the update cannot be undone")
    for phase in phases:
        unqualified = [r.rank for r in ordered if FailurePhase(phase) not in r.rewind_phases]
        if unqualified:
            blockers.append(f"envelope does not qualify rewind for phase {phase} on ranks {unqualified}")
    blockers += [f"rank {r.rank} cannot re-run update {base + 1}: {r.rerun_reason or 'unspecified'}"
                 for r in ordered if not r.rerun_ok]
    blockers += [f"guard failed on rank {r.rank} after discarding the update: {r.guard_reason or 'unspecified'}"
                 for r in ordered if not r.guard_ok]
    held = tuple(sorted({g for r in ordered for g in r.held_groups}))
    if not held:
        blockers.append("no rank reported a data-plane group to rebuild")
    blockers += _unreplaceable(held, world_size, protected)
    if blockers:
        return _reject(*reasons, *blockers)
    return AgreementDecision(RecoveryAction.REWIND, base, ordered[0].generation, held, (),
                             agreed_standbys(held, ordered))


@dataclass(frozen=True)
class ReleaseVote:
    rank: int
    ok: bool
    reason: str = ""


def decide_release(votes: Sequence[ReleaseVote | None], world_size: int) -> tuple[bool, tuple[str, ...]]:
    """Release only if every rank voted and every vote is ok (ValidatedBeforeRelease)."""
    got = {v.rank: v for v in votes if v is not None}
    reasons = [f"no release vote from rank {r}" for r in range(world_size) if r not in got]
    reasons += [f"rank {v.rank} voted against release: {v.reason or 'unspecified'}" for v in got.values() if not v.ok]
    return (not reasons, tuple(reasons))


@dataclass(frozen=True)
class EnvelopeFacts:
    """What one rank's qualified envelope allows for its platform and profile: read once at
    attach, reported at every recovery, applied by `decide_agreement` (never by an executor)."""

    preserve: bool
    rewind_phases: tuple[FailurePhase, ...]
    #: phase -> the actions its row allows, preferred first (what attach tells the user)
    allowed: tuple[tuple[FailurePhase, tuple[RecoveryAction, ...]], ...] = ()
    #: phases whose row says nobody measured them (a partial `accelpact qualify --quick` file)
    not_probed: tuple[FailurePhase, ...] = ()
    #: phases whose row qualifies Replace (a lost rank taken over by a spare, `membership.decide`)
    replace_phases: tuple[FailurePhase, ...] = ()
    #: (phase, action, unmet conditions): qualified only under conditions this run does not meet
    withheld: tuple[tuple[FailurePhase, RecoveryAction, tuple[str, ...]], ...] = ()

    def describe(self) -> str:
        return "; ".join(f"{phase}: {', '.join(map(str, actions))}" for phase, actions in self.allowed)


def envelope_facts(envelope: Envelope, platform: str, profile: str, *, met: Collection[str] = ()) -> EnvelopeFacts:
    """Read the envelope for (platform, profile). An unknown key raises UnknownObservationKey:
    attach refuses a platform or profile the envelope has no rows for, by name. `met`: the
    conditions (`envelope.model.CONDITIONS`) this run meets; an action a row qualified only under
    others is withheld (the probe that passed ran under them, so this run is not qualified)."""
    committed = ObservationKey(platform, profile, FailurePhase.COMMITTED)
    envelope.lookup(committed)
    rewind, allowed, unprobed, replace, withheld = [], [], [], [], []
    for phase in (FailurePhase.FORWARD, FailurePhase.BACKWARD, FailurePhase.OPTIMIZER, FailurePhase.COMMITTED):
        try:
            row = envelope.lookup(ObservationKey(platform, profile, phase))
        except UnknownObservationKey:  # a file without rows for this phase: nothing qualified
            continue
        actions = []
        for action in row.actions:
            unmet = tuple(c for c in row.needs(action) if c not in met)
            if unmet:
                withheld.append((phase, action, unmet))
            else:
                actions.append(action)
        allowed.append((phase, tuple(actions)))
        if "not_probed" in row.evidence:
            unprobed.append(phase)
        if phase is not FailurePhase.COMMITTED and RecoveryAction.REWIND in actions:
            rewind.append(phase)
        if RecoveryAction.REPLACE in actions:
            replace.append(phase)
    preserve = RecoveryAction.PRESERVE in dict(allowed).get(FailurePhase.COMMITTED, ())
    return EnvelopeFacts(preserve, tuple(rewind), tuple(allowed), tuple(unprobed), tuple(replace), tuple(withheld))


def envelope_warning(facts: EnvelopeFacts, profile: str, source: str) -> str | None:
    """What a user must hear at attach: the envelope file never measured this model's profile
    (every failure would then be rejected, where the built-in envelope would preserve), it
    qualified an action only under a condition this run's config does not meet, or the envelope
    is the permissive one, which measured nothing."""
    said = []
    if facts.not_probed:
        phases = ", ".join(map(str, facts.not_probed))
        said.append(f"the envelope {source} has no measured rows for profile {profile} (phases {phases} were not "
                    f"probed, e.g. by `accelpact qualify --quick`): recoveries there will be rejected. Run "
                    f"`accelpact qualify` (every framework) or set ACCELPACT_ENVELOPE=builtin")
    for phase, action, unmet in facts.withheld:
        needs = " and ".join(CONDITIONS.get(c, f"{c!r}, a condition this accelpact does not know") for c in unmet)
        said.append(f"the envelope {source} qualifies {action} in phase {phase} for {profile} only with {needs}, "
                    f"which this run does not have: failures there will be rejected")
    if source.startswith("permissive"):
        said.append("the permissive envelope grants every action without a measurement (it is for qualification "
                    "runs only): a failure may be rewound or preserved where no probe showed that to end bitwise "
                    "equal; use the file `accelpact qualify` wrote, or ACCELPACT_ENVELOPE=builtin")
    return "; ".join(said) or None
