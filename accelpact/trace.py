"""Per-rank JSON-lines traces of every protocol transition.

One record per edge taken: rank, control-plane sequence number, action (the spec's action name),
from/to phase, frontier F, generation g, the generation each cached-reference class names, and a
monotonic time. Records are written line-buffered so a rank that is SIGKILLed leaves a usable
prefix. Cheap enough to stay on by default (one small write per update).

Every record also carries `vc`, the rank's vector clock ticked for that record (the control plane
merges it on every exchange, `accelpact/control/clock.py`): what the rank could have seen of its
peers when it wrote the record. The attach record names the host, because `t` (CLOCK_MONOTONIC)
is one clock for all ranks of a host, so trace validation may compare it only between those.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from .control.clock import VectorClock

log = logging.getLogger("accelpact.trace")


class TraceWriter:
    def __init__(self, directory: str | os.PathLike | None, rank: int, attempt: int = 0,
                 clock: VectorClock | None = None):
        self.rank = rank
        self.clock = clock
        self.path: Path | None = None
        self._fh = None
        self.failed = ""  # why the trace stopped (a write failed: a full disk), if it did
        if directory is not None:
            d = Path(directory)
            d.mkdir(parents=True, exist_ok=True)
            self.path = d / f"trace-rank{rank}.jsonl"
            torn = ends_torn(self.path)
            self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
            if torn:  # a SIGKILLed predecessor's partial last line: ours starts on a line of its own
                self._fh.write("\n")
            self.write({"kind": "attach", "attempt": attempt, "pid": os.getpid(), "host": socket.gethostname()})

    @property
    def enabled(self) -> bool:
        """Whether records are written (a trace directory was given and the writer is open)."""
        return self._fh is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        record = {"rank": self.rank, "t": time.monotonic(), **record}
        if self.clock is not None:
            record["vc"] = self.clock.tick()
        try:
            self._fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        except OSError as exc:  # a full disk must not take training (or a recovery halfway) down with it
            self.failed = f"{type(exc).__name__}: {exc}"
            log.error("trace %s stopped at a failed write (%s): the rest of this run is not traced", self.path,
                      self.failed)
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:
                pass

    def edge(self, *, seq: int, action: str, src: str, dst: str, frontier: int, generation: int,
             refs: dict[str, int], late_s: float = 0.0, **extra: Any) -> None:
        """`late_s` > 0: what the edge records happened that long before it was taken (a deferred
        boundary commits its update during the next one); written only then."""
        if late_s > 0:
            extra["late_s"] = round(late_s, 6)
        self.write(
            {
                "kind": "edge",
                "seq": seq,
                "action": action,
                "from": src,
                "to": dst,
                "phase": dst,
                "F": frontier,
                "g": generation,
                "refs": refs,
                **extra,
            }
        )

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def ends_torn(path: Path) -> bool:
    """Whether `path` holds a last line without its newline (a writer killed mid-record): appended
    to, the next process's first record (its `attach`) would be glued onto it and lost."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False
