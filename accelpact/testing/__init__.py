"""Test support shared by AccelPact's own tests and by tests of code built on it."""

from accelpact.testing.faults import compare_snapshots, skip_collective_fault, state_snapshot
from accelpact.testing.spawn import RankOutcome, WorldError, run_world

__all__ = [
    "RankOutcome",
    "WorldError",
    "compare_snapshots",
    "run_world",
    "skip_collective_fault",
    "state_snapshot",
]
