"""Per-rank JSON-lines traces of every protocol transition.

One record per edge taken: rank, control-plane sequence number, action (the spec's action name),
from/to phase, frontier F, generation g, the generation each cached-reference class names, and a
monotonic time. Records are written line-buffered so a rank that is SIGKILLed leaves a usable
prefix. Cheap enough to stay on by default (one small write per update).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class TraceWriter:
    def __init__(self, directory: str | os.PathLike | None, rank: int, attempt: int = 0):
        self.rank = rank
        self.path: Path | None = None
        self._fh = None
        if directory is not None:
            d = Path(directory)
            d.mkdir(parents=True, exist_ok=True)
            self.path = d / f"trace-rank{rank}.jsonl"
            self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
            self.write({"kind": "attach", "attempt": attempt, "pid": os.getpid()})

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        record = {"rank": self.rank, "t": time.monotonic(), **record}
        self._fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def edge(self, *, seq: int, action: str, src: str, dst: str, frontier: int, generation: int,
             refs: dict[str, int], **extra: Any) -> None:
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

