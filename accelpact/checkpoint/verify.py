"""Verification of one step directory: may it be trusted (and only then unpickled)?

``judge_*`` functions are pure decisions over what was observed; ``verify_step_dir`` gathers the
observations (reads bytes, stats and hashes files) and never unpickles anything.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ManifestError
from .fsio import list_files, sha256_file, stat_size
from .manifest import Manifest, check_committed, parse_manifest, sha256_bytes
from .naming import COMMITTED_NAME, MANIFEST_NAME, parse_step_dir_name

_MAX_LISTED = 4


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one step directory; ``reason`` says why it was refused (or 'ok')."""

    ok: bool
    reason: str
    step: int | None = None
    manifest: Manifest | None = field(default=None, compare=False, repr=False)
    manifest_sha256: str | None = field(default=None, compare=False, repr=False)
    #: a refusal for the step's own content or structure (torn, corrupt, unpublished): one this run
    #: may set aside to save the step again. Not an I/O error (the step may be whole) nor a
    #: signature that does not verify (tampered or another key: evidence, not ours to move).
    damaged: bool = True

    def __bool__(self) -> bool:
        return self.ok


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:_MAX_LISTED])
    return shown + (f" (+{len(paths) - _MAX_LISTED} more)" if len(paths) > _MAX_LISTED else "")


def judge_sizes(manifest: Manifest, sizes: Mapping[str, int | None], present: Collection[str]) -> str | None:
    """Why the files on disk do not match the manifest's list and sizes, or None.

    ``sizes`` maps each manifest path to its size on disk (None: missing); ``present`` is every
    file found in the directory. A file the manifest does not list is refused too: a published
    directory is immutable, so an extra file means it was written to after publication.
    """
    missing = [f.path for f in manifest.files if sizes.get(f.path) is None]
    if missing:
        return f"{len(missing)} file(s) listed in the manifest are missing: {_listed(missing)}"
    wrong = [
        f"{f.path} has {sizes[f.path]} bytes, manifest says {f.bytes}"
        for f in manifest.files
        if sizes[f.path] != f.bytes
    ]
    if wrong:
        return f"size mismatch: {_listed(wrong)}"
    listed = {f.path for f in manifest.files} | {MANIFEST_NAME, COMMITTED_NAME}
    extra = sorted(set(present) - listed)
    if extra:
        return f"file(s) not listed in the manifest: {_listed(extra)}"
    return None


def judge_digests(manifest: Manifest, digests: Mapping[str, str]) -> str | None:
    """Why the files' content differs from the manifest, or None when every sha256 matches."""
    bad = [f.path for f in manifest.files if digests.get(f.path) != f.sha256]
    if bad:
        return f"sha256 mismatch (content corrupted): {_listed(bad)}"
    return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def verify_step_dir(path: str | os.PathLike[str], *, hash_files: bool = True, key: bytes | None = None) -> Verdict:
    """Decide whether a published step directory may be loaded.

    Checks, in order (cheap first): the name is a step name; COMMITTED exists; manifest.json
    exists, is the one COMMITTED pins by sha256, parses, and names this step; every listed file
    exists with the listed size and nothing unlisted is present; every sha256 matches
    (skipped with ``hash_files=False``, for re-checks of directories already hashed). A
    symbolic link anywhere in the step is refused (it could point outside the step). With a
    signing ``key`` COMMITTED must carry a valid signature. Reads files, writes nothing, unpickles
    nothing. A read that fails (EIO, ESTALE, EACCES) refuses this step, naming the file: it must
    not stop the loader from trying the older ones.
    """
    d = Path(path)
    step = parse_step_dir_name(d.name)
    if step is None:
        return Verdict(False, f"{d.name!r} is not a published step directory name")
    try:
        return _verify_published(d, step, hash_files, key)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else d
        return Verdict(False, f"I/O error reading {where}: {type(exc).__name__}: {exc.strerror or exc}", step,
                       damaged=False)


def _verify_published(d: Path, step: int, hash_files: bool, key: bytes | None) -> Verdict:
    """`verify_step_dir`'s checks of a directory named like step ``step``."""
    if d.is_symlink() or not d.is_dir():
        return Verdict(False, "directory does not exist" if not d.is_symlink() else "the step is a symbolic link", step)
    links = sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_symlink())
    if links:
        return Verdict(False, f"symbolic links inside the step are refused: {_listed(links)}", step)
    marker = _read(d / COMMITTED_NAME)
    if marker is None:
        return Verdict(False, "COMMITTED marker missing (save never published or was interrupted)", step)
    raw = _read(d / MANIFEST_NAME)
    if raw is None:
        return Verdict(False, "manifest.json missing", step)
    why = check_committed(marker, step, raw)
    if why:
        return Verdict(False, why, step)
    why = check_committed(marker, step, raw, key) if key is not None else None
    if why:  # whole, but not signed under this key
        return Verdict(False, why, step, damaged=False)
    try:
        manifest = parse_manifest(raw)
    except ManifestError as exc:
        return Verdict(False, f"manifest.json invalid: {exc}", step)
    if manifest.step != step:
        return Verdict(False, f"manifest names step {manifest.step}, directory is step {step}", step)
    sizes = {f.path: stat_size(d / f.path) for f in manifest.files}
    why = judge_sizes(manifest, sizes, list_files(d))
    if why:
        return Verdict(False, why, step, manifest)
    if hash_files:
        why = judge_digests(manifest, {f.path: sha256_file(d / f.path) for f in manifest.files})
        if why:
            return Verdict(False, why, step, manifest)
    return Verdict(True, "ok", step, manifest, sha256_bytes(raw))
