"""Errors of the checkpoint layer: each names what is wrong, where, and what was expected.

They all derive from :class:`CheckpointError` (defined in :mod:`accelpact.errors`, under
:class:`~accelpact.errors.AccelPactError`) so a runtime can fail-stop on the whole family, except
:class:`RestartBudgetExceeded`, which is a decision to stop, not a checkpoint fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import CheckpointError, RestartBudgetExceeded

__all__ = [
    "CheckpointDurabilityError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointLayoutError",
    "CheckpointLoadError",
    "CheckpointSaveError",
    "ManifestError",
    "NoVerifiedCheckpointError",
    "Refusal",
    "RestartBudgetExceeded",
    "agreed_failure",
]


class ManifestError(CheckpointError, ValueError):
    """A manifest (or COMMITTED marker) that does not parse or violates the schema."""


class CheckpointExistsError(CheckpointError, FileExistsError):
    """A published step directory is immutable: saving the same step again is refused."""


class CheckpointSaveError(CheckpointError):
    """A save failed on at least one rank; nothing was published."""


class CheckpointDurabilityError(CheckpointError):
    """A save's step was renamed into place, so it is published (loaders see it and verify it like
    any step), but what follows the rename failed (the fsync of the root, the re-check of the
    step): its entry in the root may not survive a crash. Not a CheckpointSaveError, whose claim
    is that nothing was published; the step is not moved aside to make that claim true either,
    since moving it is another rename whose durability hangs on the fsync that just failed.
    latest.json and retention are skipped: no older step is deleted on the strength of this one."""


def agreed_failure(exc: BaseException) -> bool:
    """Whether every rank raised `exc` at the same point of a save, after a collective that
    completed everywhere (a gathered local error, rank 0's broadcast outcome, DCP's gathered
    failures): the ranks stand together and the control group works, unlike a save whose own
    collective failed (a peer lost, a link cut), which may have left them at different points."""
    return isinstance(exc, CheckpointError) and exc.context.get("agreed") is True


class CheckpointLoadError(CheckpointError):
    """A verified checkpoint could not be applied to the live model/optimizer/app state."""


class CheckpointLayoutError(CheckpointError):
    """The newest verified checkpoint was written by another world size or layout.

    Raised before anything is loaded, on every rank: silently falling back to an older checkpoint
    of the right shape, or loading shards into the wrong topology, would both corrupt the run.
    """

    def __init__(self, message: str, *, step: int, saved: str, current: str) -> None:
        super().__init__(message, step=step, saved=saved, current=current)
        self.step = step
        self.saved = saved
        self.current = current


@dataclass(frozen=True)
class Refusal:
    """One candidate the loader would not accept, and why."""

    candidate: str
    reason: str
    #: the step's own content or structure is broken (`verify.Verdict.damaged`): one this run may set
    #: aside. Not part of a refusal's identity (candidate and reason are).
    damaged: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, str]:
        return {"candidate": self.candidate, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.candidate}: {self.reason}"


class NoVerifiedCheckpointError(CheckpointError):
    """Candidates exist but none passes verification; the message lists every refusal."""

    def __init__(self, root: str, refusals: Sequence[Refusal]) -> None:
        self.root = root
        self.refusals = tuple(refusals)
        lines = "\n".join(f"  - {r}" for r in self.refusals) or "  (none listed)"
        super().__init__(
            f"no verified checkpoint under {root}: {len(self.refusals)} candidate(s) refused:\n{lines}",
            root=root,
        )
