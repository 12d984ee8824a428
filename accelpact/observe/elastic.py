"""Recoveries and rejects as torchelastic events, so torchrun's own event handlers see them.

`torch.distributed.elastic.events.record` is how the elastic agent reports its own events; a
platform that routes them (a handler on the "null" destination, or another) gets AccelPact's
with source WORKER next to the agent's restarts, with the incident's facts as metadata."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.distributed.elastic.events import Event, EventSource, record

if TYPE_CHECKING:
    from ..runtime.evidence import Evidence


class ElasticEventsObserver:
    """A `RecoveryObserver` that records one event per incident (`accelpact.<action>`)."""

    def __init__(self, destination: str = "null"):
        self.destination = destination

    def on_commit(self, frontier: int, generation: int) -> None:
        """Commits are not events."""

    def on_recovery(self, evidence: Evidence) -> None:
        record(event_of(evidence), self.destination)

    def on_reject(self, evidence: Evidence) -> None:
        record(event_of(evidence), self.destination)

    def close(self) -> None:
        """Nothing is buffered."""


def event_of(ev: Evidence) -> Event:
    metadata: dict[str, str | int | float | bool | None] = {
        "rank": ev.rank, "attempt": ev.attempt, "index": ev.index, "update": ev.update, "action": ev.action,
        "phase": ev.phase, "cause_kind": ev.cause_kind, "cause": ev.cause[:1000], "saw_failure": ev.saw_failure,
        "failed_groups": ",".join(ev.failed_groups), "frontier": ev.frontier, "generation": ev.generation,
        "detect_s": ev.detect_s, "repair_s": ev.repair_s, "reasons": "; ".join(ev.reasons)[:1000],
        "sentence": ev.sentence,
    }
    return Event(name=f"accelpact.{ev.action}", source=EventSource.WORKER, timestamp=int(ev.wall_time * 1000),
                 metadata=metadata)
