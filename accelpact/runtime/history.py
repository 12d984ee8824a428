"""What one recovery did, for `rt.history`, the trace, the demo and the benches."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..fsm.phases import FailurePhase, RecoveryAction

if TYPE_CHECKING:
    from ..fsm.driver import Observation
    from .executor import RecoveryExecutor
    from .recovery import Driven


@dataclass
class RecoveryRecord:
    index: int  # 1-based recovery number in this process
    update: int  # update index (1-based) at whose boundary or inside which the failure struck
    action: RecoveryAction
    failure_phase: FailurePhase
    saw_failure: bool
    cause: str
    frontier: int  # committed frontier F after the recovery (unchanged by a Reject)
    generation: int
    failed_groups: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # failed groups whose successor was a standby (the rest: built)
    reasons: list[str] = field(default_factory=list)
    detect_s: float = 0.0  # failure detection: data-plane health check + boundary check wait
    link_wait_s: float = 0.0  # of detect_s: the wait for this rank's links before its check (runtime.link_wait)
    timings_s: dict[str, float] = field(default_factory=dict)  # per effect phase (Effect.phase)
    repair_s: float = 0.0  # control-plane admission → release
    standby_s: float = 0.0  # after the release: the replaced groups' standbys built again (runtime.standby)
    admitted_at: float = 0.0  # wall-clock time of the admission (`recovery.Driven.admitted_at`)
    rebound: dict[str, int] = field(default_factory=dict)  # references rebound per site kind
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    discarded: dict = field(default_factory=dict)  # what a discarded (rewound) update left behind
    #: evidence only, not in `to_dict` (the trace holds one rank's view; every rank's reports
    #: would make each rank's trace grow with the world): what every rank reported to
    #: agreement, and the decision taken on them
    reports: list[dict] = field(default_factory=list, repr=False)
    decision: dict | None = field(default=None, repr=False)
    #: a Replace: the lost ranks, the spares that took over, the peers the state came from, the
    #: bytes moved (`member_change.describe`)
    replacement: dict | None = None

    @classmethod
    def of(cls, index: int, update: int, obs: Observation, detect_s: float, driven: Driven,
           executor: RecoveryExecutor) -> RecoveryRecord:
        """The record of a recovery `recovery.drive` ran with `executor` on observation `obs`."""
        outcome = driven.outcome
        return cls(
            index=index, update=update, action=outcome.action, failure_phase=obs.failure_phase,
            saw_failure=obs.saw_failure, cause=obs.cause, frontier=outcome.frontier, generation=outcome.generation,
            failed_groups=[g.key for g in (outcome.decision.failed_groups if outcome.decision else ())],
            adopted=[key for key, _ in (outcome.decision.standby if outcome.decision else ())],
            reasons=list(outcome.reasons), detect_s=detect_s, link_wait_s=getattr(executor, "link_wait_s", 0.0),
            timings_s=driven.timings_s, repair_s=driven.repair_s,
            admitted_at=driven.admitted_at,
            rebound=dict(executor.rebound), edges=list(outcome.edges), discarded=executor.discarded,
            reports=list(getattr(executor, "reports", [])),
            decision=outcome.decision.to_dict() if outcome.decision else None,
        )

    @classmethod
    def control_plane_reject(cls, index: int, update: int, phase: FailurePhase | None, reason: str, frontier: int,
                             generation: int, register: str) -> RecoveryRecord:
        """The record of a reject without the protocol: the control plane itself failed."""
        return cls(index=index, update=update, action=RecoveryAction.REJECT, failure_phase=phase or FailurePhase.COMMITTED,
                   saw_failure=True, cause=reason, frontier=frontier, generation=generation,
                   reasons=[reason, f"register={register}"])

    @property
    def preserved(self) -> bool:
        return self.action is RecoveryAction.PRESERVE

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["reports"], d["decision"]
        d["action"] = str(self.action)
        d["failure_phase"] = str(self.failure_phase)
        return d

    def summary(self) -> str:
        phases = " ".join(f"{k}={v * 1e3:.1f}ms" for k, v in self.timings_s.items())
        return (
            f"recovery #{self.index} at update {self.update} ({self.failure_phase}): {self.action} "
            f"F={self.frontier} g={self.generation} groups={','.join(self.failed_groups) or '-'} "
            f"detect={self.detect_s:.2f}s{f' (links {self.link_wait_s:.2f}s)' if self.link_wait_s else ''} repair={self.repair_s * 1e3:.1f}ms [{phases}]"
        )
