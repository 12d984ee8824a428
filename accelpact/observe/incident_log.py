"""Each incident as a log line (the sentence) and as one JSON line of evidence per rank.

The log line goes through `logging` ("accelpact.incident": INFO for a recovery, WARNING for a
reject), which is also how OpenTelemetry's logging bridge turns it into an OTel log record.
The evidence (`incidents-rank<r>.jsonl` in the trace directory, appended line-buffered like the
traces) is what `accelpact report` reads for errors and stacks."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..trace import ends_torn

if TYPE_CHECKING:
    from ..runtime.evidence import Evidence

log = logging.getLogger("accelpact.incident")


def incidents_path(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"incidents-rank{rank}.jsonl"


class IncidentLog:
    """A `RecoveryObserver`: the sentence to the log, the evidence to the trace directory."""

    def __init__(self, trace_dir: str | None, rank: int):
        self.path = incidents_path(trace_dir, rank) if trace_dir else None
        self._fh = None

    def on_commit(self, frontier: int, generation: int) -> None:
        """Commits are the traces' business."""

    def on_recovery(self, evidence: Evidence) -> None:
        log.info("rank %d: %s", evidence.rank, evidence.sentence, extra={"accelpact_incident": evidence.index})
        self._write(evidence)

    def on_reject(self, evidence: Evidence) -> None:
        log.warning("rank %d: %s", evidence.rank, evidence.sentence, extra={"accelpact_incident": evidence.index})
        self._write(evidence)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _write(self, evidence: Evidence) -> None:
        if self.path is None:
            return
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = ends_torn(self.path)  # a killed writer's last line: never glue a record onto it
            self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
            if torn:
                self._fh.write("\n")
        self._fh.write(json.dumps({"kind": "incident", **evidence.to_dict()}, default=str) + "\n")
