"""The directories and files a `Config` names, checked once at attach.

Why: a path that cannot be used (a component that is a file, no permission) failed deep inside:
a `NotADirectoryError` traceback from the trace writer, a fresh checkpoint directory reported as
"1 candidate(s) refused: latest.json unreadable", a metrics file whose every write logged a
traceback (found by review). Checked here, it is a `ConfigError` naming the setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def usable_directory(path: str | os.PathLike[str], setting: str) -> Path:
    """`path` as a directory this process can write into (made if missing), or ConfigError."""
    where = Path(path)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{setting}={str(path)!r} cannot be used as a directory: {exc.strerror or exc}") from exc
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting}={str(path)!r} is a directory this process cannot write into")
    return where


def usable_file(path: str | os.PathLike[str], setting: str) -> Path:
    """`path` as a file this process can (re)write: its directory usable, and not a directory itself."""
    where = Path(path)
    usable_directory(where.parent, f"the directory of {setting}")
    if where.is_dir():
        raise ConfigError(f"{setting}={str(path)!r} is a directory, not a file")
    return where
