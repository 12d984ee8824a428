"""The publish protocol's file-system steps (rank 0 unless stated), in the order they run.

1. ``prepare_tmp``: refuse an existing step, clean stray tmp dirs, create ``step-F.tmp-<attempt>``
   (an existing ``step-F`` that was refused is first renamed aside by ``set_aside``, see the manager);
2. every rank writes its DCP shards and its rank-state file (fsynced) into the tmp dir;
3. every rank hashes a stripe of the files (``hash_stripe``); rank 0 gathers them and runs
   ``loadability_problem`` (every file DCP's metadata references, and every rank's state file,
   is present and listed);
4. ``commit_and_publish``: manifest.json, then COMMITTED pinning the manifest's sha256, fsync of
   the tree, atomic rename to ``step-F``, fsync of the root;
5. ``write_latest``: latest.json, a pointer only, replaced atomically;
6. retention deletes what ``retention_plan`` names.
A crash before (4)'s rename leaves only a tmp dir, which no loader considers; a crash after it
leaves a complete, verifiable step whatever latest.json says. A failure after the rename is a
CheckpointDurabilityError, not a CheckpointSaveError: the step is published, whatever else failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from .errors import CheckpointDurabilityError, CheckpointExistsError, CheckpointSaveError
from .fsio import (
    atomic_replace,
    digest_file,
    fsync_dir,
    fsync_tree_dirs,
    list_files,
    remove_trees,
    write_durable,
)
from .manifest import FileEntry, Manifest, committed_marker
from .naming import (
    COMMITTED_NAME,
    LATEST_NAME,
    MANIFEST_NAME,
    RANK_STATE_DIR,
    SHARDS_DIR,
    classify_entries,
    rank_state_name,
    refused_dir_name,
    step_dir_name,
    tmp_dir_name,
)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stray_tmp_dirs(root: Path) -> list[Path]:
    """Unpublished save directories under ``root`` (a crashed or failed earlier save)."""
    if not root.is_dir():
        return []
    return [root / name for name in classify_entries(os.listdir(root)).tmps]


def prepare_tmp(root: Path, step: int, attempt: str) -> Path:
    """Create a fresh tmp dir for ``step``; refuses if ``step`` was already published."""
    final = root / step_dir_name(step)
    if final.exists():
        raise CheckpointExistsError(
            f"checkpoint step {step} is already published at {final}; published steps are never overwritten"
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / tmp_dir_name(step, attempt)
    tmp.mkdir()
    (tmp / SHARDS_DIR).mkdir()
    (tmp / RANK_STATE_DIR).mkdir()
    fsync_dir(root)
    return tmp


def set_aside(root: Path, step: int, attempt: str) -> str:
    """Rename the published ``step-F`` to ``step-F.refused-<attempt>-<time>`` (made durable), so that
    F can be saved again; returns the new name. Renamed rather than deleted: it is the evidence of
    what went wrong, and retention ages it out like any refused step."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    aside = refused_dir_name(step, f"{attempt}-{stamp}")
    os.rename(root / step_dir_name(step), root / aside)
    fsync_dir(root)
    return aside


def hash_stripe(tmp: Path, rank: int, world_size: int) -> list[FileEntry]:
    """(every rank) Hash the files whose sorted index is ``rank`` mod ``world_size``.

    Striping by listing rather than by who wrote what keeps this independent of DCP's file naming
    and spreads the hashing of an N-rank checkpoint over N readers.
    """
    files = list_files(tmp)
    out = []
    for rel in files[rank::world_size]:
        size, sha = digest_file(tmp / rel)
        out.append(FileEntry(rel, size, sha))
    return out


def assemble_entries(tmp: Path, gathered: Iterable[Iterable[FileEntry]]) -> list[FileEntry]:
    """Rank 0's listing is authoritative: use peers' digests for it, hash any the peers missed."""
    by_path = {e.path: e for entries in gathered for e in entries}
    out = []
    for rel in list_files(tmp):
        entry = by_path.get(rel)
        if entry is None:
            size, sha = digest_file(tmp / rel)
            entry = FileEntry(rel, size, sha)
        out.append(entry)
    return out


def loadability_problem(entries: Collection[FileEntry], referenced: Collection[str], world_size: int) -> str | None:
    """Why the written files could not be loaded back, or None (pure).

    ``referenced`` are the storage files named by DCP's metadata (relative to the shards dir).
    """
    listed = {e.path for e in entries}
    needed = {f"{SHARDS_DIR}/.metadata"} | {f"{SHARDS_DIR}/{r}" for r in referenced}
    needed |= {rank_state_name(r) for r in range(world_size)}
    missing = sorted(needed - listed)
    if missing:
        return f"written checkpoint is incomplete, missing: {', '.join(missing[:6])}"
    return None


def commit_and_publish(tmp: Path, final: Path, manifest: Manifest, key: bytes | None = None) -> None:
    """Write manifest + COMMITTED (signed with `key` if given), make the tree durable, then
    atomically rename tmp -> final and make the rename durable. A failure of that last fsync is a
    CheckpointDurabilityError: the step is published by then."""
    raw = manifest.to_json().encode("utf-8")
    write_durable(tmp / MANIFEST_NAME, raw)
    write_durable(tmp / COMMITTED_NAME, committed_marker(manifest.step, raw, key).encode("utf-8"))
    fsync_tree_dirs(tmp)
    if final.exists():  # rename(2) would silently replace an empty directory
        raise CheckpointExistsError(f"{final} appeared while step {manifest.step} was being saved")
    os.rename(tmp, final)
    try:
        fsync_dir(final.parent)
    except OSError as exc:
        raise published_not_durable(final, manifest.step, f"the fsync of {final.parent} failed", exc) from exc


def published_not_durable(final: Path, step: int, what: str, exc: BaseException) -> CheckpointDurabilityError:
    """The error of a failure after the publishing rename (see CheckpointDurabilityError)."""
    return CheckpointDurabilityError(
        f"step {step} is published at {final}, but {what} after the rename: {type(exc).__name__}: {exc}; "
        "it may not survive a crash (a restore verifies it like any step); latest.json and retention were "
        "skipped", path=str(final), step=step)


def latest_pointer(manifest: Manifest, name: str) -> dict[str, object]:
    return {
        "step": manifest.step,
        "dir": name,
        "run_id": manifest.run_id,
        "attempt": manifest.attempt,
        "written_at": utc_now(),
        "note": "lookup hint only: loaders scan step directories and verify them",
    }


def write_latest(root: Path, pointer: Mapping[str, object]) -> None:
    """Replace latest.json atomically (tmp + fsync + rename + fsync of the root)."""
    atomic_replace(root / LATEST_NAME, (json.dumps(pointer, sort_keys=True) + "\n").encode("utf-8"))


def delete_steps(root: Path, names: Iterable[str]) -> list[str]:
    """Delete step (or tmp) directories under ``root``; returns the failures."""
    names = list(names)
    if not names:
        return []
    failures = remove_trees(root / n for n in names)
    fsync_dir(root)
    return failures


def raise_gathered(errors: Iterable[str | None], what: str) -> None:
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise CheckpointSaveError(f"{what} failed: " + "; ".join(f"rank {r}: {e}" for r, e in failed),
                                  agreed=True)  # every rank holds the same gathered errors
