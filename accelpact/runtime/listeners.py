"""The runtime's one extension point for code that must see inside an update.

A listener learns which phase the update in flight is in and may order, or hold back, the
boundary's health probes. The drills' fault injector (`accelpact.faults.FaultInjector`) is one;
a tracer or a profiler could be another. The runtime calls listeners and never knows what they
do, so drill code stays out of the production path."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..fsm.phases import FailurePhase


@runtime_checkable
class UpdateListener(Protocol):
    def on_phase(self, update: int, phase: FailurePhase) -> None:
        """Update `update` (1-based) entered `phase`; COMMITTED: its boundary check begins."""

    def probe_order(self, labels: list[str]) -> list[str]:
        """The order in which the boundary probes the data-plane groups (a permutation)."""

    def before_probe(self, label: str) -> bool:
        """Called right before probing group `label`; False holds the probe back."""
