"""Fault plans: which real fault to inject at (update, failure phase, rank).

Parsing and validation are pure; `inject.py` performs the faults. The textual form is what
`ACCELPACT_FAULTS` carries, so that any trainer can be drilled unchanged:
``skip@5:committed:2,late@9:backward:0,kill@12:forward:3``; a kill or stall can also strike
inside a recovery (``kill@5:agree:2``, `RECOVERY_STEPS`), and a kill in the work after a commit
(``kill@4:save:2``, `AFTER_COMMIT_STEPS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..errors import ConfigError
from ..fsm.phases import FailurePhase


class FaultKind(StrEnum):
    SKIP = "skip"  # the rank skips a collective, so its peers hit the group timeout
    LATE = "late"  # the rank arrives after the group timeout, then finds the connection closed
    KILL = "kill"  # SIGKILL: permanent loss of the rank
    #: the rank freezes, alive (heartbeating), for STALL_FACTOR x the data timeout: cut off from
    #: its peers long enough to be declared lost; when it wakes it must learn that it was replaced
    STALL = "stall"
    #: the rank's boundary check fails after its contribution left (`miss@5:check:1`): its peers
    #: may complete the check and commit, this rank never learns it. What a rank sees when a peer
    #: dies in the middle of the all-reduce; with a `kill@5:check:R` it splits the survivors
    #: across two frontiers (the roll forward's drill)
    MISS = "miss"


#: Steps of a recovery a `kill` or `stall` can strike in (`kill@5:agree:2`: rank 2 dies when the
#: recovery that update 5's failure started reaches agreement): the effect phases of
#: `accelpact.fsm.effects`, in protocol order.
RECOVERY_STEPS = ("guard", "agree", "restore", "replace", "rebind", "validate", "release")

#: Points of the boundary a `kill` or `miss` can strike at. `check`: right after the rank's
#: boundary check completed, before it commits (`kill@5:check:3`: its contribution reached every
#: peer, it dies with update 5 finished but not committed), or failed (`miss`).
BOUNDARY_STEPS = ("check",)

#: The work after a commit a `kill` or `miss` can strike at. `save`: as the work due after the commit
#: begins (the checkpoint save, the replica digest check: `runtime.after_commit`); `kill@4:save:2`:
#: rank 2 committed update 4 and dies before that work, and its peers meet its absence inside it;
#: `miss@4:save:2`: rank 2's control plane fails there while every process lives (a link cut past
#: the save's bound). Where nothing is due after the commit, nothing strikes.
AFTER_COMMIT_STEPS = ("save",)


@dataclass(frozen=True, order=True)
class Fault:
    update: int  # 1-based index of the optimizer update in this process's run
    phase: FailurePhase | str  # a failure phase, or one of RECOVERY_STEPS
    rank: int
    kind: FaultKind
    group: str = "replicate"  # which data-plane group a skip/late at the boundary targets

    def __str__(self) -> str:
        return f"{self.kind}@{self.update}:{self.phase}:{self.rank}"


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def __str__(self) -> str:
        return ",".join(map(str, self.faults))

    def at(self, update: int, phase: FailurePhase | str, rank: int) -> Fault | None:
        for f in self.faults:
            if f.update == update and f.phase == phase and f.rank == rank:
                return f
        return None

    def validate(self, world_size: int) -> FaultPlan:
        for f in self.faults:
            if not 0 <= f.rank < world_size:
                raise ConfigError(f"fault {f}: rank {f.rank} is out of range for world size {world_size}")
        seen: set[tuple[int, FailurePhase, int]] = set()
        for f in self.faults:
            key = (f.update, f.phase, f.rank)
            if key in seen:
                raise ConfigError(f"fault plan names update {f.update}, phase {f.phase}, rank {f.rank} twice")
            seen.add(key)
        return self

    @classmethod
    def parse(cls, text: str | None) -> FaultPlan:
        if text is None or not text.strip():
            return cls()
        faults = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            faults.append(_parse_one(item))
        return cls(tuple(sorted(faults)))


def _parse_one(item: str) -> Fault:
    form = "kind@update:phase:rank, e.g. skip@5:committed:2"
    kind_text, at, rest = item.partition("@")
    if not at:
        raise ConfigError(f"fault {item!r}: missing '@'; expected {form}")
    try:
        kind = FaultKind(kind_text.strip().lower())
    except ValueError:
        kinds = ", ".join(k.value for k in FaultKind)
        raise ConfigError(f"fault {item!r}: unknown kind {kind_text!r}; expected one of {kinds}") from None
    parts = rest.split(":")
    if len(parts) != 3:
        raise ConfigError(f"fault {item!r}: expected {form}")
    update_text, phase_text, rank_text = parts
    try:
        update = int(update_text)
        rank = int(rank_text)
    except ValueError:
        raise ConfigError(f"fault {item!r}: update and rank must be integers; expected {form}") from None
    if update < 1:
        raise ConfigError(f"fault {item!r}: update must be >= 1 (updates are counted from 1)")
    step = phase_text.strip().lower()
    if step in BOUNDARY_STEPS:
        if kind not in (FaultKind.KILL, FaultKind.MISS):
            raise ConfigError(f"fault {item!r}: only kill or miss can strike at the boundary's {step!r}")
        return Fault(update, step, rank, kind)
    if step in AFTER_COMMIT_STEPS:
        if kind not in (FaultKind.KILL, FaultKind.MISS):
            raise ConfigError(f"fault {item!r}: only kill or miss can strike at the work after a commit ({step!r})")
        return Fault(update, step, rank, kind)
    if kind is FaultKind.MISS:
        raise ConfigError(f"fault {item!r}: a miss strikes at the boundary check or the save only "
                          "(miss@U:check:R, miss@U:save:R)")
    if step in RECOVERY_STEPS:
        if kind not in (FaultKind.KILL, FaultKind.STALL):
            raise ConfigError(f"fault {item!r}: only kill or stall can strike inside a recovery (step {step!r})")
        return Fault(update, step, rank, kind)
    try:
        phase = FailurePhase.parse(phase_text)
    except ValueError as exc:
        raise ConfigError(f"fault {item!r}: {exc}; or a recovery step: {', '.join(RECOVERY_STEPS)}; or the "
                          f"boundary's: {', '.join(BOUNDARY_STEPS)}; or after the commit: {', '.join(AFTER_COMMIT_STEPS)}") from None
    return Fault(update, phase, rank, kind)
