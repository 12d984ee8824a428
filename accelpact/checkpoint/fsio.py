"""File-system effects with the durability the publish protocol relies on.

What is fsynced, and why:
- every file this layer writes (rank-state files, manifest.json, COMMITTED, latest.json,
  attempts.jsonl) is fsynced before it is closed; DCP shards and .metadata are fsynced by DCP's
  writer (``sync_files=True``);
- every directory of a step's tmp tree is fsynced before the rename, so the entries exist
  on disk before the step can become visible;
- the checkpoint root is fsynced after the publishing rename, after latest.json is replaced and
  after retention deletes, so a crash cannot resurrect a pre-rename or pre-delete view.
Where a platform cannot fsync a directory (no O_DIRECTORY), that one step is skipped.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def digest_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(bytes, sha256) of one file from the same single streaming read, in constant memory."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as stream:
        while block := stream.read(CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Streaming sha256 of one file."""
    return digest_file(path)[1]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creates, renames, deletes) durable."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except (IsADirectoryError, PermissionError):  # platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        # EINVAL/ENOTSUP/EBADF: this file system cannot fsync a directory (its entries are durable
        # by its own rules); anything else (EIO) means they may not be, and the step must not publish
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_tree_dirs(root: str | os.PathLike[str]) -> None:
    """fsync every directory under ``root``, deepest first, then ``root`` itself."""
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -t[0].count(os.sep)):
        fsync_dir(dirpath)


def write_durable(path: str | os.PathLike[str], data: bytes, *, exclusive: bool = True) -> None:
    """Write ``data`` to a new file and fsync it before returning; refuses to clobber by default."""
    with open(path, "xb" if exclusive else "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


def atomic_replace(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` so readers see the old or the new content, never a torn one."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_durable(tmp, data)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(target.parent)


def append_durable(path: str | os.PathLike[str], line: bytes) -> None:
    """Append one record (a line) on an O_APPEND descriptor, then fsync. Every byte is written or
    an OSError raised (a short write on a nearly full disk used to pass unseen). A file that ends
    inside a line (a torn earlier append: a short write, a crash before the fsync) gets a newline
    first, so the fragment costs only itself: found by review, the next record was glued onto it
    and skipped with it as one unreadable line."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        data = memoryview((b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b"") + line)
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def list_files(root: str | os.PathLike[str]) -> list[str]:
    """Every regular file under ``root`` as a sorted POSIX path relative to it."""
    base = Path(root)
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())


def tree_fingerprint(root: str | os.PathLike[str]) -> tuple[tuple[str, int, int, int], ...]:
    """(path, size, mtime_ns, inode) of every file under ``root``: changes when any file is rewritten."""
    base = Path(root)
    out = []
    for rel in list_files(base):
        st = os.stat(base / rel)
        out.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def stat_size(path: str | os.PathLike[str]) -> int | None:
    """Size of a regular file, or None when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size if os.path.isfile(path) else None


def remove_trees(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Delete directories; returns the ones that could not be removed (with the error)."""
    failures = []
    for p in paths:
        try:
            shutil.rmtree(p)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failures.append(f"{p}: {exc}")
    return failures
