"""The boundary check with this rank's update time on it, and the straggler warning (the effect;
the verdict is `accelpact.stragglers`, pure).

An update's time runs from this rank's release at the previous clean boundary to its arrival at
this one (before the health check, whose probes already wait for the late peers): every rank is
released by the same all-reduce, so a rank that arrives later took longer.
After a recovery (ranks leave it at different moments) and at the first boundary nothing is
measured, and a boundary that starts a recovery is not recorded: its times hold a timeout.
"""

from __future__ import annotations

import logging
import sys
import time

from ..config import Config
from ..control import ControlPlane
from ..stragglers import StragglerReport, StragglerWindow

log = logging.getLogger("accelpact.runtime")


class StragglerWatch:
    """`rt.stragglers`: `report()` gives every rank's update-time p50/p90 over the window and the
    ranks named stragglers (the same on every rank)."""

    def __init__(self, control: ControlPlane, config: Config, *, rank: int, world_size: int):
        self.control, self.rank = control, rank
        self.window = StragglerWindow(world_size, window=config.straggler_window, factor=config.straggler_factor)
        self._released: float | None = None
        self._elapsed: float | None = None  # this rank's update time in the check in flight

    def check(self, flag: int, arrived: float | None = None) -> int:
        """`ControlPlane.boundary_check(flag)` carrying this rank's update time (up to `arrived`,
        a `time.perf_counter()` reading; default now); records the boundary's times when it is
        clean. ControlPlaneError propagates."""
        result = self.settle(self.post(flag, arrived))
        if result == 0:
            self._released = time.perf_counter()
        return result

    def post(self, flag: int, arrived: float | None = None):
        """The check started, not waited for (a deferred boundary): the rank goes on at once, so
        its next update is timed from here. `settle` finishes it."""
        end = time.perf_counter() if arrived is None else arrived
        self._elapsed = None if self._released is None else max(0.0, end - self._released)
        work = self.control.boundary_post(flag, self._elapsed)
        self._released = time.perf_counter()
        return work

    def settle(self, work) -> int:
        """The agreed flag of a posted check; a clean boundary's times go into the window."""
        self._released, released = None, self._released
        result = self.control.boundary_result(work)
        if result == 0:
            self._released = released
            times = self.control.update_times
            if self._elapsed is not None and all(t is not None for t in times):
                self._say(*self.window.add(times))  # type: ignore[arg-type]
        return result

    def report(self) -> StragglerReport:
        return self.window.report()

    def _say(self, named: tuple[int, ...], recovered: tuple[int, ...]) -> None:
        """Rank 0 names each new straggler once (log and stderr); every rank knows the same."""
        if self.rank != 0 or not (named or recovered):
            return
        report = self.report()
        for r in named:
            log.warning(report.describe(r))
            print(f"[accelpact] WARNING: {report.describe(r)}", file=sys.stderr, flush=True)
        for r in recovered:
            log.info("rank %d is no longer a straggler: median update %.3f s", r, report.p50[r])
