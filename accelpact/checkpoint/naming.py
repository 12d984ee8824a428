"""Names inside a checkpoint root, and the pure classification of a root's entries.

Step numbers are parsed as integers and ordered numerically, never by string: "the largest
name" is not a source of truth (seed 004 §6), and zero padding only keeps listings readable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

STEP_PREFIX = "step-"
STEP_DIGITS = 12
TMP_MARK = ".tmp-"
#: a published step set aside because it was refused, so that its step can be saved again
REFUSED_MARK = ".refused-"

MANIFEST_NAME = "manifest.json"
COMMITTED_NAME = "COMMITTED"
LATEST_NAME = "latest.json"
SHARDS_DIR = "shards"
RANK_STATE_DIR = "rank-state"

_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_RE = re.compile(r"^step-(\d+)\.tmp-([A-Za-z0-9_.-]+)$")
_REFUSED_RE = re.compile(r"^step-(\d+)\.refused-([A-Za-z0-9_.-]+)$")
_ATTEMPT_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def step_dir_name(step: int) -> str:
    """Published directory name of committed frontier ``step``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def tmp_dir_name(step: int, attempt: str | int) -> str:
    """Private directory a save writes into before it is atomically renamed."""
    tag = str(attempt)
    if not _ATTEMPT_RE.match(tag):
        raise ValueError(f"attempt tag {tag!r} must match [A-Za-z0-9_-]+")
    return f"{step_dir_name(step)}{TMP_MARK}{tag}"


def refused_dir_name(step: int, tag: str) -> str:
    """Where a refused step directory is set aside: never loaded, aged out by retention."""
    if not _ATTEMPT_RE.match(tag):
        raise ValueError(f"refusal tag {tag!r} must match [A-Za-z0-9_-]+")
    return f"{step_dir_name(step)}{REFUSED_MARK}{tag}"


def rank_state_name(rank: int) -> str:
    """Relative path of one rank's application-state file inside a step directory."""
    return f"{RANK_STATE_DIR}/rank-{rank:05d}.pt"


def parse_step_dir_name(name: str) -> int | None:
    """Step of a published directory name, or None when ``name`` is not one."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def is_tmp_dir_name(name: str) -> bool:
    """True for an unpublished (in-progress or abandoned) save directory."""
    return _TMP_RE.match(name) is not None


def parse_refused_dir_name(name: str) -> int | None:
    """Step of a refused directory set aside (`refused_dir_name`), or None when ``name`` is not one."""
    m = _REFUSED_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RootListing:
    """A checkpoint root's entries, sorted into what the loader may consider and what it ignores."""

    steps: tuple[tuple[int, str], ...]  # (step, name), newest first
    tmps: tuple[str, ...]
    others: tuple[str, ...]
    refused: tuple[tuple[int, str], ...] = ()  # (step, name) of refused steps set aside, newest first

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.steps)


def classify_entries(names: Iterable[str]) -> RootListing:
    """Split directory entry names into published steps (newest first), tmp dirs, refused steps
    set aside, and the rest."""
    steps: list[tuple[int, str]] = []
    refused: list[tuple[int, str]] = []
    tmps: list[str] = []
    others: list[str] = []
    for name in names:
        step, aside = parse_step_dir_name(name), parse_refused_dir_name(name)
        if step is not None:
            steps.append((step, name))
        elif aside is not None:
            refused.append((aside, name))
        elif is_tmp_dir_name(name):
            tmps.append(name)
        else:
            others.append(name)
    steps.sort(reverse=True)
    refused.sort(reverse=True)
    return RootListing(tuple(steps), tuple(sorted(tmps)), tuple(sorted(others)), tuple(refused))
