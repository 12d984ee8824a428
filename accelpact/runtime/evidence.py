"""The evidence a Reject leaves behind: one JSON file per rank and attempt, naming the reasons,
the error with its traceback, and the recovery record."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from ..errors import EXIT_REJECTED
from .history import RecoveryRecord


def write_reject_evidence(trace_dir: str | None, *, rank: int, attempt: int, frontier: int, generation: int,
                          opt_step: int, update: int, reasons: list[str], error: BaseException | None,
                          record: RecoveryRecord) -> str | None:
    """The file's path, or None without a trace directory."""
    if trace_dir is None:
        return None
    path = Path(trace_dir) / f"reject-rank{rank}-attempt{attempt}.json"
    body = {
        "rank": rank, "attempt": attempt, "exit_code": EXIT_REJECTED, "frontier": frontier,
        "generation": generation, "opt_step": opt_step, "update": update, "reasons": reasons,
        "error": repr(error) if error is not None else None,
        "traceback": "".join(traceback.format_exception(error)) if error is not None else None,
        "recovery": record.to_dict(),
    }
    path.write_text(json.dumps(body, indent=2, default=str))
    return str(path)
