"""Goodput over a rolling window: the share of recent wall time that went into updates that
count (pure; the caller passes the clock).

Time between two boundaries is productive when it ends in a commit, and lost when it ends in a
recovery: all of it for a Rewind or a Reject (the update is thrown away), only the detection
and repair for a Preserve (its update commits)."""

from __future__ import annotations

from collections import deque


class RollingGoodput:
    def __init__(self, window_s: float = 300.0):
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._last: float | None = None  # end of the previous interval (a boundary)
        self._spans: deque[tuple[float, float, bool]] = deque()  # (start, end, productive)

    def start(self, t: float) -> None:
        """Training starts (attach): intervals are measured from here."""
        self._last = t

    def commit(self, t: float) -> None:
        self._add(t, lost_s=0.0)

    def incident(self, t: float, lost_s: float | None = None) -> None:
        """A recovery ended at `t`; `lost_s` of the time before it was lost (None: all of it)."""
        self._add(t, lost_s=lost_s)

    def _add(self, t: float, lost_s: float | None) -> None:
        if self._last is None:
            self._last = t
            return
        start = self._last
        cut = start if lost_s is None else max(start, min(t, t - lost_s))
        if cut > start:
            self._spans.append((start, cut, True))
        if t > cut:
            self._spans.append((cut, t, lost_s == 0.0))
        self._last = t
        while self._spans and self._spans[0][1] < t - self.window_s:
            self._spans.popleft()

    def ratio(self, now: float) -> float | None:
        """Productive seconds / measured seconds within [now - window, now]; None before any."""
        lo = now - self.window_s
        total = good = 0.0
        for start, end, productive in self._spans:
            overlap = max(0.0, min(end, now) - max(start, lo))
            total += overlap
            good += overlap if productive else 0.0
        return good / total if total > 0 else None
