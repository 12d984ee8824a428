"""The straggler signal: which rank stays slower than its peers. Pure: no torch, no clock.

In synchronous training the slowest rank sets everybody's pace, and a rank that is slow for a
reason of its own (a throttled device, a noisy neighbour, a failing disk under its data loader)
looks, from the outside, like nothing more than a slow job. Every rank's update time reaches
every rank with the boundary check (`ControlPlane.boundary_check`), so each rank can keep the
same window and come to the same verdict.

A rank is a straggler when the window is full and its median update time exceeds `factor` times
the median of its peers' medians: medians, so that one hiccup (a GC pause, a page fault) is not a
straggler, and a full window, so that only a rank that *stays* slower is named.

What the times can show: collectives inside the update tie the ranks together (a fast rank waits
in the next all-gather for the slow one), so the signal sees the part of a rank's slowness after
its last collective of the update (the optimizer step, the data loader, the trainer's own code
between updates), not slowness that its peers wait out inside the update.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .stats import nearest_rank, quantile

__all__ = ["StragglerReport", "StragglerWindow", "find_stragglers"]


def find_stragglers(medians: Sequence[float], factor: float) -> tuple[int, ...]:
    """The ranks whose median update time exceeds `factor` times their peers' median median.

    Every rank runs this over every rank's median (every quarter window: `StragglerWindow`), so it must not be
    quadratic: one sort, and each rank's peers' median read off the sorted list with that rank
    left out (a median of the other n-1 values, as `statistics.median` gives it). Measured at
    1,024 ranks: 74 ms per boundary for the per-rank median of a list copy, 0.36 ms now; plain
    Python, because numpy's per-call cost made it 5x slower at a handful of ranks."""
    if not factor > 1:
        raise ValueError(f"a straggler factor must be > 1, got {factor!r}")
    n = len(medians)
    if n < 2:
        return ()
    order = sorted(range(n), key=medians.__getitem__)
    ordered = [medians[r] for r in order]
    place = [0] * n  # each rank's place in the sorted list
    for i, r in enumerate(order):
        place[r] = i
    m = n - 1  # peers

    def peer(k: int, p: int) -> float:  # the k-th smallest of the peers of the rank at place p
        return ordered[k] if k < p else ordered[k + 1]

    out = []
    for r in range(n):
        p = place[r]
        peers = peer(m // 2, p) if m % 2 else (peer(m // 2 - 1, p) + peer(m // 2, p)) / 2
        if peers > 0 and medians[r] > factor * peers:
            out.append(r)
    return tuple(out)


@dataclass(frozen=True)
class StragglerReport:
    """Per-rank update-time percentiles (seconds) over the window and the ranks named stragglers
    (empty until the window is full). ``samples``: clean boundaries in the window."""

    samples: int
    window: int
    factor: float
    p50: tuple[float, ...]
    p90: tuple[float, ...]
    stragglers: tuple[int, ...]

    def per_rank(self) -> dict[int, dict[str, float]]:
        return {r: {"p50_s": self.p50[r], "p90_s": self.p90[r]} for r in range(len(self.p50))}

    def describe(self, rank: int) -> str:
        peers = statistics.median([m for r, m in enumerate(self.p50) if r != rank])
        return (f"rank {rank} is a straggler: median update {self.p50[rank]:.3f} s over the last {self.samples} "
                f"updates, {self.p50[rank] / peers:.1f}x its peers' median {peers:.3f} s (factor {self.factor:g})")


class StragglerWindow:
    """The last `window` boundaries' update times of every rank, and the verdict on them.

    The times sit in a ring of rows. Up to `SMALL_WORLD` ranks the medians are plain `sorted`
    columns; above it, the ring is one array and the medians one numpy sort. Why two: numpy's
    per-call cost (cold caches after the update: ~80 µs) is most of the work at a handful of
    ranks, and plain Python columns are 5x slower than numpy at 1,024.

    The verdict is judged when the window fills and then every `every` boundaries (a quarter
    window), not at every boundary: a median over the window moves only after half a window of
    slow updates, so judging it four times as often as that delays a verdict by less than the
    median itself does, and it takes W sorts off most updates (~50 µs of the training thread at 4
    ranks here, ~1 ms at 1,024)."""

    SMALL_WORLD = 32

    def __init__(self, world_size: int, *, window: int, factor: float):
        if world_size < 1 or window < 1:
            raise ValueError(f"need world_size >= 1 and window >= 1, got {world_size} and {window}")
        if not factor > 1:
            raise ValueError(f"a straggler factor must be > 1, got {factor!r}")
        self.world_size, self.window, self.factor = world_size, window, factor
        self.every = max(1, window // 4)
        self._small = world_size <= self.SMALL_WORLD
        self._rows: list[tuple[float, ...]] = []  # the ring, small worlds
        self._times = None if self._small else np.zeros((window, world_size), dtype=np.float64)
        self._count = 0  # boundaries recorded (the ring's next row is _count % window)
        self._flagged: tuple[int, ...] = ()

    def add(self, times: Sequence[float]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Record one boundary's update times (one per rank); returns (ranks newly named
        stragglers, ranks no longer stragglers), so that each change is said once."""
        if len(times) != self.world_size:
            raise ValueError(f"expected {self.world_size} update times, got {len(times)}")
        row = self._count % self.window
        if self._small:
            values = tuple(float(t) for t in times)
            if row < len(self._rows):
                self._rows[row] = values
            else:
                self._rows.append(values)
        else:
            self._times[row] = times
        self._count += 1
        # every clean boundary passes here: the verdict needs the medians only, only once the
        # window is full, and only every `every` boundaries (the p90s of `report` are for whoever asks)
        past = self._count - self.window
        if past < 0 or past % self.every:
            return (), ()
        before, self._flagged = self._flagged, find_stragglers(self._quantiles(0.5), self.factor)
        return (tuple(r for r in self._flagged if r not in before),
                tuple(r for r in before if r not in self._flagged))

    def _quantiles(self, q: float) -> tuple[float, ...]:
        """Nearest-rank `q`-quantile of every rank's times in the window (`stats.quantile`)."""
        n = min(self._count, self.window)
        if n == 0:
            return (0.0,) * self.world_size
        if self._small:
            return tuple(quantile(column, q) for column in zip(*self._rows))
        return tuple(np.sort(self._times[:n], axis=0)[nearest_rank(n, q)].tolist())

    def report(self) -> StragglerReport:
        """The window's percentiles now, and the ranks named at the last verdict."""
        p50, p90 = self._quantiles(0.5), self._quantiles(0.9)
        return StragglerReport(min(self._count, self.window), self.window, self.factor, p50, p90, self._flagged)
