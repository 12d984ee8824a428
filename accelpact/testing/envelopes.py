"""Envelope rows for tests, with the evidence `accelpact qualify` would have recorded for them: a
row is refused unless its evidence backs every action it grants (`envelope.file._unverified`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..envelope.file import REBUILD_PROBE


def passing_evidence(actions: Iterable[str], requires: Iterable[str] = ()) -> dict[str, Any]:
    """Evidence of one passing, bitwise-equal probe run for each of `actions` but reject (each
    passed only under `requires`), and of a passing platform probe."""
    probe = {"qualified": True, "runs": 1, "passed": 1, "bitwise": True, "requires": list(requires)}
    evidence: dict[str, Any] = {action: dict(probe) for action in actions if action != "reject"}
    if evidence:
        evidence[REBUILD_PROBE] = {"qualified": True, "runs": 1, "passed": 1, "bitwise": None, "requires": []}
    return evidence
