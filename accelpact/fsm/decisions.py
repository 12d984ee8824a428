"""Pure decision functions of the protocol: no torch, no I/O, deterministic.

Every rank can run these on the same gathered inputs and reach the same answer; in the runtime
rank 0 runs them and publishes the result through the control plane's single outcome register,
so that even a non-deterministic input order could not split the ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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

    @property
    def key(self) -> str:
        return f"{self.label}[{','.join(map(str, self.ranks))}]"

    @classmethod
    def parse(cls, key: str) -> GroupId:
        label, _, rest = key.partition("[")
        if not rest.endswith("]"):
            raise ValueError(f"malformed group key {key!r}; expected label[r0,r1,...]")
        ranks = tuple(int(x) for x in rest[:-1].split(",") if x)
        return cls(label, ranks)


@dataclass(frozen=True)
class RankReport:
    """What one rank contributes to frontier agreement."""

    rank: int
    frontier: int  # F: committed updates
    generation: int  # g: communicator generation
    opt_step: int  # tau: optimizer steps applied
    failure_phase: FailurePhase  # phi as seen by this rank (committed for ranks that only joined)
    failed_groups: tuple[GroupId, ...] = ()
    guard_ok: bool = True
    guard_reason: str = ""

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
        )


@dataclass(frozen=True)
class AgreementDecision:
    """The one decision of frontier agreement, identical on every rank."""

    action: RecoveryAction
    frontier: int | None
    generation: int | None
    failed_groups: tuple[GroupId, ...] = ()
    reasons: tuple[str, ...] = field(default=())

    @property
    def repair_ranks(self) -> frozenset[int]:
        """R: ranks that are members of some failed group and so take part in replace/rebind."""
        return frozenset(r for g in self.failed_groups for r in g.ranks)

    def in_failed_group(self, rank: int) -> bool:
        return rank in self.repair_ranks

    def to_dict(self) -> dict:
        return {
            "action": str(self.action),
            "frontier": self.frontier,
            "generation": self.generation,
            "failed_groups": [g.key for g in self.failed_groups],
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> AgreementDecision:
        return cls(
            action=RecoveryAction(d["action"]),
            frontier=d["frontier"],
            generation=d["generation"],
            failed_groups=tuple(GroupId.parse(k) for k in d.get("failed_groups", ())),
            reasons=tuple(d.get("reasons", ())),
        )


def _reject(*reasons: str) -> AgreementDecision:
    return AgreementDecision(RecoveryAction.RESTART, None, None, (), tuple(reasons))


def decide_agreement(
    reports: Iterable[RankReport | None],
    world_size: int,
    *,
    protected_groups: Iterable[str] = ("control",),
) -> AgreementDecision:
    """Frontier agreement: Preserve only if every rank reported, all at a committed boundary,
    all guards passed, and all agree on F, g and tau; otherwise Restart (reject, fail-stop).

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
    uncommitted = [r.rank for r in ordered if r.failure_phase is not FailurePhase.COMMITTED]
    if uncommitted:
        phases = sorted({str(by_rank[r].failure_phase) for r in uncommitted})
        reasons.append(f"failure outside a committed boundary on ranks {uncommitted} (phase {phases})")
    bad_guard = [r for r in ordered if not r.guard_ok]
    if uncommitted and bad_guard:
        # busy FSDP units are what an uncommitted failure looks like; name the ranks, not the units
        reasons.append(f"guard failed on ranks {[r.rank for r in bad_guard]} (units not idle mid-update)")
    else:
        for r in bad_guard:
            reasons.append(f"guard failed on rank {r.rank}: {r.guard_reason or 'unspecified'}")
    for name, attr in (("frontier F", "frontier"), ("generation g", "generation"), ("optimizer step tau", "opt_step")):
        values = {getattr(r, attr) for r in ordered}
        if len(values) > 1:
            detail = ", ".join(f"r{r.rank}={getattr(r, attr)}" for r in ordered)
            reasons.append(f"{name} mismatch: {detail}")
    failed = tuple(sorted({g for r in ordered for g in r.failed_groups}))
    if not failed and not uncommitted:
        reasons.append("no rank reported a failed data-plane group: nothing to repair")
    protected = set(protected_groups)
    for g in failed:
        if g.label in protected:
            reasons.append(f"group {g.key} is part of the control plane and cannot be replaced in-band")
        if any(not 0 <= m < world_size for m in g.ranks):
            reasons.append(f"group {g.key} names ranks outside the world of size {world_size}")
    if reasons:
        return _reject(*reasons)
    first = ordered[0]
    return AgreementDecision(RecoveryAction.PRESERVE, first.frontier, first.generation, failed, ())


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
