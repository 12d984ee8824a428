"""The evidence one recovery or reject leaves: what this rank saw, what every rank reported,
what was decided and why, how long each phase took, and for a suspected hang where every
thread of this rank was: during the hang (the hang watch's stacks) and at recovery. Observers export it (`accelpact.observe`); a Reject also leaves it as
one JSON file per rank and attempt, with the error and its traceback."""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_REJECTED
from ..observe.incident import PEER, IncidentFacts, cause_kind, nobody_lost, observers_of, peers_of, sentence
from ..observe.stacks import thread_stacks
from .history import RecoveryRecord

log = logging.getLogger("accelpact.runtime")

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass
class Evidence:
    """One rank's record of one incident (a recovery that resumed, or a reject)."""

    rank: int
    attempt: int
    index: int  # recovery number in this process
    update: int
    action: str  # preserve | rewind | reject
    phase: str  # failure phase: committed | forward | backward | optimizer
    saw_failure: bool  # this rank's own collective failed (else it joined through the control plane)
    cause: str  # this rank's classified cause, "" when it only joined
    #: timeout | connection_closed | retired_communicator | other | bug | control_plane | unknown, or
    #: peer: this rank only joined a recovery others observed (reports carry no cause)
    cause_kind: str
    failed_groups: list[str]
    observers: list[int]  # ranks that saw the failure themselves (from the gathered reports)
    peers: list[int]  # whom this rank lost (members of its failed groups that saw nothing)
    reports: list[dict]  # what every rank reported to agreement
    decision: dict | None
    reasons: list[str]
    frontier: int  # F after the recovery
    generation: int
    opt_step: int
    detect_s: float
    repair_s: float
    timings_s: dict[str, float]
    error: dict | None  # the exception the update raised: type, message, traceback
    sentence: str
    stacks: dict[str, list[str]] = field(default_factory=dict)  # timeout seen here: every thread, at recovery
    #: every thread's stack taken during the hang (`observe.hang_watch`): where this rank waited or
    #: stalled, with when and how long its phase and update had run; None when no phase ran that long
    hang_stacks: dict | None = None
    wall_time: float = 0.0  # time.time() when the evidence was taken
    t: float = 0.0  # time.monotonic(), the traces' clock

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evidence_of(rt: Runtime, record: RecoveryRecord, error: BaseException | None) -> Evidence:
    """The evidence of `record` on this rank (reads the threads' stacks for a suspected hang)."""
    bugs = [r["bug"] for r in record.reports if r.get("bug")]
    kind = cause_kind(record.cause, bug=bugs[0] if bugs else "") if record.saw_failure or bugs else PEER
    observers = observers_of(record.reports) or ([rt.rank] if record.saw_failure else [])
    facts = IncidentFacts(
        update=record.update, phase=str(record.failure_phase), action=str(record.action),
        observers=tuple(observers), failed_groups=tuple(record.failed_groups),
        cause=record.cause if record.saw_failure else "", detect_s=record.detect_s, repair_s=record.repair_s,
        reasons=tuple(record.reasons), generation_after=record.generation,
        nobody_lost=nobody_lost(record.replacement))
    return Evidence(
        rank=rt.rank, attempt=rt.attempt, index=record.index, update=record.update, action=str(record.action),
        phase=str(record.failure_phase), saw_failure=record.saw_failure, cause=record.cause, cause_kind=kind,
        failed_groups=list(record.failed_groups), observers=observers,
        peers=peers_of(rt.rank, record.failed_groups, observers) if record.saw_failure else [],
        reports=record.reports, decision=record.decision, reasons=list(record.reasons),
        frontier=record.frontier, generation=record.generation, opt_step=rt.opt_step, detect_s=record.detect_s,
        repair_s=record.repair_s, timings_s=dict(record.timings_s), error=_error(error), sentence=sentence(facts),
        stacks=thread_stacks() if record.saw_failure and kind == "timeout" else {},
        hang_stacks=_hang_stacks(rt, record.update), wall_time=time.time(), t=time.monotonic(),
    )


def _hang_stacks(rt: Runtime, update: int) -> dict | None:
    watch = getattr(rt, "hang_watch", None)  # None: the watch is off (Config.hang_watch_fraction=0)
    if watch is None:
        return None
    taken = watch.take(update, also_next=rt.config.boundary == "deferred")
    return taken.to_dict() if taken is not None else None


def _error(error: BaseException | None) -> dict | None:
    if error is None:
        return None
    return {"type": type(error).__name__, "message": str(error),
            "traceback": "".join(traceback.format_exception(error))}


def _unused(path: Path) -> Path:
    n = 2
    found = path
    while found.exists():  # found by review: a relaunch's attempt 0 overwrote the last launch's evidence
        found = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return found


def write_reject_evidence(trace_dir: str | None, evidence: Evidence) -> str | None:
    """The reject's file (`reject-rank<r>-attempt<a>.json`; `...-attempt<a>-<n>.json` where an
    earlier launch of the same trace directory left one: attempts count from 0 again in every
    launch, and its evidence is kept), or None without a trace directory."""
    if trace_dir is None:
        return None
    path = _unused(Path(trace_dir) / f"reject-rank{evidence.rank}-attempt{evidence.attempt}.json")
    err = evidence.error or {}
    body = {
        "rank": evidence.rank, "attempt": evidence.attempt, "exit_code": EXIT_REJECTED,
        "frontier": evidence.frontier, "generation": evidence.generation, "opt_step": evidence.opt_step,
        "update": evidence.update, "reasons": evidence.reasons,
        "error": f"{err['type']}({err['message']!r})" if err else None, "traceback": err.get("traceback"),
        "incident": evidence.to_dict(),
    }
    try:
        path.write_text(json.dumps(body, indent=2, default=str))
    except OSError as exc:  # a full disk: the reject goes on (exit 75), its reasons are still logged
        log.error("reject evidence %s not written: %s: %s", path, type(exc).__name__, exc)
        return None
    return str(path)
