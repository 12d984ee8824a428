"""A vector clock per rank, so that a trace says what each rank could have seen of the others.

Why: per-rank sequence numbers and wall-clock times cannot tell a release that followed every
peer's validation from one that merely happened later (issue #18). A vector clock can: it ticks
on every trace record and merges on every control-plane exchange (the boundary all-reduce, the
report gather, the votes and the outcome register), so record a happened before record b exactly
when b's clock has reached a's tick of a's rank. The clock only moves numbers; the control plane
carries it, the trace writer stamps it, `model_checking/causality.py` judges it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


def merged(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Elementwise MAX: what a rank knows after learning what another knew."""
    if len(a) != len(b):
        raise ValueError(f"vector clocks of {len(a)} and {len(b)} ranks cannot be merged")
    return [max(x, y) for x, y in zip(a, b)]


def ticked(v: Sequence[int], rank: int) -> list[int]:
    """`v` after one more event of `rank`."""
    out = list(v)
    out[rank] += 1
    return out


def as_clock(value: object, world_size: int) -> list[int] | None:
    """`value` as a clock of `world_size` ranks, or None if it is not one (an old peer's message
    or a value without a clock: nothing is merged, nothing fails)."""
    if not isinstance(value, (list, tuple)) or len(value) != world_size:
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        return None
    return list(value)


class VectorClock:
    """One rank's clock. Thread-safe: the trace may be written off the main thread."""

    def __init__(self, rank: int, world_size: int):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of {world_size}")
        self.rank = rank
        self._v = [0] * world_size
        self._lock = threading.Lock()

    def read(self) -> list[int]:
        with self._lock:
            return list(self._v)

    def tick(self) -> list[int]:
        """A local event (one trace record): the clock it carries."""
        with self._lock:
            self._v = ticked(self._v, self.rank)
            return list(self._v)

    def merge(self, other: object) -> None:
        """Learn what a peer knew; a value that is no clock of this world is ignored."""
        got = as_clock(other, len(self._v))
        if got is not None:
            with self._lock:
                self._v = merged(self._v, got)
