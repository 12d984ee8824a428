"""The effects of the recovery protocol and the executor protocol that performs them.

One vocabulary: each `Effect` class is what a row of the transition table names in its
`effects` column (`table.py`), what the pure driver (`driver.py`) yields, what the trace's
per-phase timings are keyed by, and one method of `Executor`. The real executor
(`accelpact.runtime.executor.RecoveryExecutor`) performs them against process groups and the
control plane; the simulator (`simulation.SimExecutor`) performs the same requests against a fake
bus. Both subclass `Executor`, whose methods are abstract, so an executor that misses a handler
cannot even be instantiated, and `perform` is the single dispatch from request to handler.

An executor reports facts and performs requests; it never decides. Every rule (which action,
whether a rank may rewind, whether to release) lives in `decisions.py`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from .decisions import GroupId, RankReport

# ---------------------------------------------------------------------------------- results ----


@dataclass(frozen=True)
class GuardVerdict:
    """Whether this rank's framework state is idle and intact (the guard phase's fact)."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class StepResult:
    """Whether one repair step (restore, replace, rebind, validate) succeeded on this rank."""

    ok: bool
    reason: str = ""

    @classmethod
    def failed(cls, exc: BaseException, what: str = "") -> StepResult:
        """A step that raised: its type and message, and those of the exception it came from (c10d
        re-raises gloo's error under its own message, and the gloo one says what happened; found
        by review: only the outer text reached the vote)."""
        inner = exc.__cause__ if exc.__cause__ is not None else None if exc.__suppress_context__ else exc.__context__
        reason = f"{what}{type(exc).__name__}: {exc}"
        if inner is not None:
            reason += f" (from {type(inner).__name__}: {inner})"
        return cls(False, reason)


@dataclass(frozen=True)
class ControlPlaneFailure:
    """Returned instead of a result when the control plane timed out or a peer vanished."""

    reason: str


@dataclass(frozen=True)
class OutcomeUnknown:
    """ForceReject's result when the outcome register stayed unreachable for the whole control
    timeout. A peer may have read "resume" from it, so this rank must not claim "reject" alone:
    it fail-stops where it stands, without an outcome (the spec's Halt)."""

    reason: str


# ---------------------------------------------------------------------------------- effects ----


@dataclass(frozen=True)
class Effect:
    """Base class of the requests the driver yields.

    `handler` names the `Executor` method that performs it; `phase` is the key of the per-phase
    timings in `rt.history` and the trace."""

    handler: ClassVar[str]
    phase: ClassVar[str]


@dataclass(frozen=True)
class Quiesce(Effect):
    """Guard: flush device work, check every FSDP unit idle. Result: GuardVerdict.

    With `discard` (this rank's update was interrupted) the partial update is thrown away first
    (gradients, unsharded parameters, pending collectives): either the update is rewound or the
    process fails stop, and in both cases nothing of it may survive."""

    handler: ClassVar[str] = "quiesce"
    phase: ClassVar[str] = "guard"
    discard: bool = False
    #: the groups this rank saw fail: on a GPU they are aborted before anything synchronises
    failed: tuple[GroupId, ...] = ()


@dataclass(frozen=True)
class GatherReports(Effect):
    """Frontier agreement: post this report, receive every rank's (None where missing).
    Result: list[RankReport | None] or ControlPlaneFailure."""

    handler: ClassVar[str] = "gather_reports"
    phase: ClassVar[str] = "agree"
    report: RankReport


@dataclass(frozen=True)
class RestoreBoundary(Effect):
    """Rewind: drop this rank's partial update, undo an applied step from the pre-step copy when
    `undo_step`, restore the boundary snapshot of F (RNG, data cursor, buffers).
    Result: StepResult."""

    handler: ClassVar[str] = "restore_boundary"
    phase: ClassVar[str] = "restore"
    frontier: int
    undo_step: bool = False


@dataclass(frozen=True)
class ReplaceGroups(Effect):
    """Retire the failed groups this rank belongs to; build identical-membership replacements
    at `generation` (or adopt the agreed standbys). Result: StepResult."""

    handler: ClassVar[str] = "replace_groups"
    phase: ClassVar[str] = "replace"
    groups: tuple[GroupId, ...]
    generation: int
    #: (group key, token): adopt this rank's standby of that token instead of building (agreed)
    standby: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RebindReferences(Effect):
    """Redirect every cached reference to the replacements, then prove none names a retired
    group. Result: StepResult (ok = proof passed)."""

    handler: ClassVar[str] = "rebind_references"
    phase: ClassVar[str] = "rebind"
    groups: tuple[GroupId, ...]
    generation: int


@dataclass(frozen=True)
class ValidateGroups(Effect):
    """Integer all-reduce on each replacement, result checked. Result: StepResult."""

    handler: ClassVar[str] = "validate_groups"
    phase: ClassVar[str] = "validate"
    groups: tuple[GroupId, ...]
    generation: int


@dataclass(frozen=True)
class VoteRelease(Effect):
    """Post this rank's release vote and wait for the single outcome register (rank 0 collects
    the votes, `decisions.decide_release` decides, rank 0 publishes).
    Result: "resume" | "reject", or ControlPlaneFailure."""

    handler: ClassVar[str] = "vote_release"
    phase: ClassVar[str] = "release"
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class ForceReject(Effect):
    """Write "reject" into the outcome register if it is still empty. Result: the register's
    value afterwards ("reject", or "resume" if the release was already decided), or
    OutcomeUnknown if the register could not be reached within the control timeout."""

    handler: ClassVar[str] = "force_reject"
    phase: ClassVar[str] = "reject"
    reason: str


#: Every effect type, in protocol order; `Executor` has exactly one handler for each.
EFFECTS: tuple[type[Effect], ...] = (
    Quiesce, GatherReports, RestoreBoundary, ReplaceGroups, RebindReferences, ValidateGroups,
    VoteRelease, ForceReject,
)
EFFECTS_BY_NAME: dict[str, type[Effect]] = {cls.__name__: cls for cls in EFFECTS}


# --------------------------------------------------------------------------------- executor ----


class Executor(abc.ABC):
    """Performs the driver's requests on one rank. Handlers report facts; they decide nothing."""

    @abc.abstractmethod
    def quiesce(self, effect: Quiesce) -> GuardVerdict: ...

    @abc.abstractmethod
    def gather_reports(self, effect: GatherReports) -> list[RankReport | None] | ControlPlaneFailure: ...

    @abc.abstractmethod
    def restore_boundary(self, effect: RestoreBoundary) -> StepResult: ...

    @abc.abstractmethod
    def replace_groups(self, effect: ReplaceGroups) -> StepResult: ...

    @abc.abstractmethod
    def rebind_references(self, effect: RebindReferences) -> StepResult: ...

    @abc.abstractmethod
    def validate_groups(self, effect: ValidateGroups) -> StepResult: ...

    @abc.abstractmethod
    def vote_release(self, effect: VoteRelease) -> str | ControlPlaneFailure: ...

    @abc.abstractmethod
    def force_reject(self, effect: ForceReject) -> str | OutcomeUnknown: ...


def perform(executor: Executor, effect: Effect) -> object:
    """The one dispatch from a request to its handler."""
    return getattr(executor, effect.handler)(effect)


def failed(effect: Effect, reason: str) -> object:
    """What `effect` returns when its handler raised instead (`reason` says what): the failure
    value the driver already handles for it, so the rank votes, or forces the reject, with its
    peers, never leaves the protocol while they wait for it in a collective."""
    if isinstance(effect, Quiesce):
        return GuardVerdict(False, reason)
    if isinstance(effect, (GatherReports, VoteRelease)):
        return ControlPlaneFailure(reason)
    if isinstance(effect, ForceReject):
        return OutcomeUnknown(reason)
    return StepResult(False, reason)
