"""Which checkpoint to restore: the pure decision, given a way to verify one candidate.

The loader never trusts latest.json or the largest name. It walks published step directories
newest first, verifies each, and takes the first that passes; every refusal is kept with its
reason. The newest verified candidate must match the current world (size and layout): if it
does not, the decision is an error, not a silent fall back to an older checkpoint that happens
to fit, since that would mean the job was restarted into another shape.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .errors import Refusal
from .manifest import Layout, ManifestError, describe_layout, layout_mismatch, parse_manifest
from .naming import MANIFEST_NAME, classify_entries, parse_step_dir_name
from .verify import Verdict


class Outcome(StrEnum):
    NO_CHECKPOINT = "no_checkpoint"  # nothing was ever published here: a fresh start
    SELECTED = "selected"
    NONE_VERIFIED = "none_verified"
    LAYOUT_MISMATCH = "layout_mismatch"


@dataclass(frozen=True)
class Selection:
    """The decision rank 0 broadcasts, so every rank restores the same step or fails the same way."""

    outcome: Outcome
    refusals: tuple[Refusal, ...] = ()
    step: int | None = None
    name: str | None = None
    message: str | None = None
    saved_layout: str | None = None
    current_layout: str | None = None
    latest_note: str | None = None


def parse_latest(data: bytes | None) -> tuple[int | None, str | None]:
    """(step, problem) of latest.json; the pointer is a hint, so problems are notes, not errors."""
    if data is None:
        return None, "latest.json missing"
    try:
        doc = json.loads(data.decode("utf-8"))
        step = doc["step"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        return None, f"latest.json unreadable ({type(exc).__name__}: {exc})"
    if isinstance(step, bool) or not isinstance(step, int):
        return None, f"latest.json step {step!r} is not an int"
    return step, None


def judge_latest(latest: tuple[int | None, str | None], selection: Selection) -> str | None:
    """Why latest.json disagrees with the step actually chosen, or None when it agrees."""
    step, problem = latest
    if problem:
        return problem
    if step == selection.step:
        return None
    name = f"step {step}"
    for r in selection.refusals:
        if parse_step_dir_name(r.candidate) == step:
            return f"latest.json points at {name}, which was refused: {r.reason}"
    if selection.step is not None and step is not None and step < selection.step:
        return (f"latest.json points at {name}, older than the newest verified step {selection.step} "
                "(pointer not updated before the previous attempt ended)")
    return f"latest.json points at {name}, which does not exist"


def select_candidate(
    candidates: Sequence[str],
    verify: Callable[[str], Verdict],
    *,
    run_id: str,
    world_size: int,
    layout: Layout,
) -> Selection:
    """Walk ``candidates`` (published step names, newest first) and decide what to restore.

    ``verify`` is called lazily, newest first, and not after the first acceptable candidate.
    """
    if not candidates:
        return Selection(Outcome.NO_CHECKPOINT)
    refusals: list[Refusal] = []
    for name in candidates:
        verdict = verify(name)
        if not verdict.ok:
            refusals.append(Refusal(name, verdict.reason, damaged=verdict.damaged))
            continue
        manifest = verdict.manifest
        assert manifest is not None  # a passing verdict always carries its manifest
        if manifest.run_id != run_id:
            refusals.append(Refusal(name, f"written by run {manifest.run_id!r}, this is run {run_id!r}"))
            continue
        why = layout_mismatch(manifest, world_size, layout)
        if why:
            return Selection(
                Outcome.LAYOUT_MISMATCH, tuple(refusals), manifest.step, name, why,
                describe_layout(manifest.world_size, manifest.layout), describe_layout(world_size, layout),
            )
        return Selection(Outcome.SELECTED, tuple(refusals), manifest.step, name)
    return Selection(Outcome.NONE_VERIFIED, tuple(refusals))


def recorded_run(root: str | os.PathLike[str]) -> str | None:
    """The run id in the manifest of the newest step published under `root` (None: no step, or
    its manifest unreadable: it will be refused at restore with its reason anyway). Reads one
    small file; verifies nothing."""
    try:
        steps = classify_entries(os.listdir(root)).steps
    except OSError:
        return None
    for _, name in steps:  # newest first: the first readable manifest
        try:
            return parse_manifest((Path(root) / name / MANIFEST_NAME).read_bytes()).run_id
        except (OSError, ManifestError):
            continue
    return None
