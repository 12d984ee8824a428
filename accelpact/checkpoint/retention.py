"""Retention: which published step directories to delete after a successful save (pure).

Keep the newest ``keep`` verified versions, plus milestones (step % keep_every == 0) when asked.
Directories newer than the oldest kept verified version are never deleted, even when they fail
verification: they may be evidence, and they age out on later saves. Everything older than the
``keep``-th verified version is deleted. With fewer than ``keep`` verified versions nothing is
deleted.

A version may also be *unknown* (None): this process has not hashed it (after a restart, every
step but the restored one). Reading it to find out would mean rank 0 re-reading whole steps
inside a save, while its peers wait. An unknown version never counts towards ``keep``, so it
only goes once ``keep`` newer versions are known good; a milestone is kept unless known bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RetentionPlan:
    keep: tuple[str, ...]
    delete: tuple[str, ...]


def retention_plan(
    steps: Sequence[tuple[int, str, bool | None]], keep: int, keep_every: int | None = None
) -> RetentionPlan:
    """``steps`` are (step, name, verified: True, False or None for unknown) in any order; returns
    names to keep and to delete."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"keep_every must be >= 1 or None, got {keep_every}")
    kept: list[str] = []
    deleted: list[str] = []
    verified_seen = 0
    for step, name, verified in sorted(steps, reverse=True):
        milestone = verified is not False and keep_every is not None and step % keep_every == 0
        if verified_seen < keep or milestone:
            kept.append(name)
        else:
            deleted.append(name)
        verified_seen += int(verified is True)
    return RetentionPlan(tuple(kept), tuple(deleted))
