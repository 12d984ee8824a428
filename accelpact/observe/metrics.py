"""Prometheus metrics of the rank's training: committed updates, recoveries by action and
cause, time lost per incident, goodput over a rolling window, generation and replica count, and
the straggler signal (this rank's update-time percentiles, whether it is named a straggler).

Opt-in (`Config.metrics_port` / ACCELPACT_METRICS_PORT, `Config.metrics_textfile` /
ACCELPACT_METRICS_TEXTFILE) and only with `prometheus_client` installed. The metrics live for
the process, as Prometheus expects of counters: one registry and one HTTP server per process,
shared by every runtime the process attaches (a restart in the same process keeps counting),
and the server keeps answering after `rt.close()` until the process ends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .window import RollingGoodput

if TYPE_CHECKING:
    from ..runtime.evidence import Evidence
    from ..stragglers import StragglerReport

log = logging.getLogger("accelpact.observe")

#: Seconds: detection waits out a data-plane timeout (seconds); repair is milliseconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: The textfile is rewritten at most this often on commits (always at an incident and at close).
TEXTFILE_EVERY_S = 1.0
#: The straggler gauges are refreshed at most this often (their percentiles are not free per update).
STRAGGLERS_EVERY_S = 1.0

_lock = threading.Lock()
_process: _ProcessMetrics | None = None


class _ProcessMetrics:
    """The process's registry and its metrics (every one labelled with the rank)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.committed = Counter("accelpact_committed_updates", "Updates committed (F advanced)", ["rank"], registry=r)
        self.recoveries = Counter("accelpact_recoveries", "Recoveries by outcome and this rank's classified cause "
                                  "(peer: the rank joined a recovery other ranks observed)",
                                  ["rank", "action", "cause"], registry=r)
        self.lost = Histogram("accelpact_incident_lost_seconds", "Time lost per incident, by stage: detect (fault to "
                              "recovery start; for a failure inside an update, from the update's start), repair "
                              "(admission to release), first_update (release to the next commit)",
                              ["rank", "stage"], buckets=BUCKETS, registry=r)
        self.goodput = Gauge("accelpact_goodput_ratio", "Share of the rolling window's wall time spent in updates "
                             "that count", ["rank"], registry=r)
        self.generation = Gauge("accelpact_generation", "Communicator generation g", ["rank"], registry=r)
        self.replicas = Gauge("accelpact_replicas", "Data-parallel replicas (members of this rank's replicate "
                              "group)", ["rank"], registry=r)
        self.frontier = Gauge("accelpact_frontier", "Committed frontier F", ["rank"], registry=r)
        self.update_seconds = Gauge("accelpact_update_seconds", "This rank's update time over the straggler "
                                    "window (release at one clean boundary to arrival at the next), by quantile",
                                    ["rank", "quantile"], registry=r)
        self.straggler = Gauge("accelpact_straggler", "1 while this rank is named a straggler (its median update "
                               "time above the straggler factor times its peers' median)", ["rank"], registry=r)
        self.saves = Counter("accelpact_checkpoint_saves", "Checkpoint saves by outcome: published, or failed "
                             "(the job went on without it, or failed stop)", ["rank", "outcome"], registry=r)
        self.checkpoint_step = Gauge("accelpact_checkpoint_step", "Newest checkpoint this run published (the L2 "
                                     "fallback: F minus this is what a restart would replay)", ["rank"], registry=r)
        self.servers: dict[int, Any] = {}

    def serve(self, port: int) -> bool:
        """Start the HTTP endpoint on `port` once per process; False (logged) if it cannot bind."""
        if port in self.servers:
            return True
        from prometheus_client import start_http_server

        try:
            self.servers[port] = start_http_server(port, registry=self.registry)
        except OSError as exc:  # a taken port must not stop training: say so, keep the textfile
            log.warning("Prometheus endpoint on port %d not started: %s", port, exc)
            return False
        log.info("Prometheus metrics on http://0.0.0.0:%d/metrics", port)
        return True


def process_metrics() -> _ProcessMetrics:
    """The process's metrics (created on first use; raises ImportError without prometheus_client)."""
    global _process
    with _lock:
        if _process is None:
            _process = _ProcessMetrics()
        return _process


def textfile_path(template: str, rank: int) -> Path:
    """This rank's file: `{rank}` in the path is replaced; a directory gets
    accelpact-rank<r>.prom; otherwise -rank<r> goes before the suffix (one file per rank, so
    node_exporter's textfile collector reads every rank of the host)."""
    if "{rank}" in template:
        return Path(template.format(rank=rank))
    path = Path(template)
    if path.is_dir() or template.endswith("/"):
        return path / f"accelpact-rank{rank}.prom"
    return path.with_name(f"{path.stem}-rank{rank}{path.suffix or '.prom'}")


class PrometheusObserver:
    """A `RecoveryObserver` that keeps the rank's metrics current."""

    def __init__(self, *, rank: int, replicas: int | Callable[[], int], port: int | None = None,
                 textfile: str | None = None,
                 window_s: float = 300.0, frontier: int = 0, generation: int = 0,
                 stragglers: Callable[[], StragglerReport] | None = None,
                 clock: Callable[[], float] = time.monotonic, position: Callable[[], int] | None = None):
        self.m = process_metrics()
        self.rank, self.label = rank, str(rank)
        self.port = port if port is not None and self.m.serve(port) else None
        self.textfile = textfile_path(textfile, rank) if textfile else None
        self.clock = clock
        self.window = RollingGoodput(window_s)
        self.window.start(clock())
        self._boundary = clock()  # when the last boundary (commit or recovery) ended
        self._recovered_at: float | None = None  # a recovery ended; the next commit is the first update
        self._written = 0.0
        self.stragglers = stragglers  # rt.stragglers.report: the same verdict on every rank
        #: this rank's index in the world now (a shrink renumbers it; the label stays the rank's at attach)
        self.position = position if position is not None else (lambda r=rank: r)
        self._stragglers_at: float | None = None
        #: read again after each recovery: a shrink leaves fewer replicas (a number: fixed)
        self.replicas = replicas if callable(replicas) else (lambda n=replicas: n)
        self.m.replicas.labels(self.label).set(self.replicas())
        self._gauges(frontier, generation)

    def on_commit(self, frontier: int, generation: int) -> None:
        self.on_late_commit(frontier, generation, 0.0)

    def on_late_commit(self, frontier: int, generation: int, late_s: float) -> None:
        """The update ended `late_s` ago (a deferred boundary, agreed in the next update): it is
        timed to its end, so what the next update spent before it failed (a hang, say) counts as
        that failure's detection, not as this update's productive time."""
        now = self.clock()
        ended = max(now - late_s, self._boundary)
        self.m.committed.labels(self.label).inc()
        if self._recovered_at is not None:
            self.m.lost.labels(self.label, "first_update").observe(ended - self._recovered_at)
            self._recovered_at = None
        self.window.commit(ended)
        self._boundary = ended
        self._gauges(frontier, generation)
        self._straggler_gauges(now)
        if self.textfile is not None and now - self._written >= TEXTFILE_EVERY_S:
            self._write(now)

    def on_recovery(self, evidence: Evidence) -> None:
        self._incident(evidence)
        self._recovered_at = self._boundary

    def on_reject(self, evidence: Evidence) -> None:
        self._incident(evidence)

    def on_checkpoint(self, step: int, error: str | None) -> None:
        self.m.saves.labels(self.label, "failed" if error else "published").inc()
        if error is None:
            self.m.checkpoint_step.labels(self.label).set(step)
        if self.textfile is not None:
            self._write(self.clock())

    def close(self) -> None:
        if self.textfile is not None:
            self._write(self.clock())

    def _incident(self, ev: Evidence) -> None:
        now = self.clock()
        self.m.recoveries.labels(self.label, ev.action, ev.cause_kind).inc()
        if ev.action == "preserve":  # Preserve commits the update whose boundary failed (F+1)
            self.m.committed.labels(self.label).inc()
        detect = ev.detect_s if ev.phase == "committed" else max(ev.detect_s, now - ev.repair_s - self._boundary)
        self.m.lost.labels(self.label, "detect").observe(detect)
        self.m.lost.labels(self.label, "repair").observe(ev.repair_s)
        keeps_update = ev.action == "preserve" and ev.phase == "committed"
        self.window.incident(now, lost_s=detect + ev.repair_s if keeps_update else None)
        self._boundary = now
        self.m.replicas.labels(self.label).set(self.replicas())
        self._stragglers_at = None  # a shrink starts a new straggler window: read it at the next commit
        self._gauges(ev.frontier, ev.generation)
        if self.textfile is not None:
            self._write(now)

    def _gauges(self, frontier: int, generation: int) -> None:
        self.m.frontier.labels(self.label).set(frontier)
        self.m.generation.labels(self.label).set(generation)
        ratio = self.window.ratio(self.clock())
        if ratio is not None:
            self.m.goodput.labels(self.label).set(ratio)

    def _straggler_gauges(self, now: float) -> None:
        """This rank's p50/p90 and whether it is named a straggler (each rank exports its own)."""
        if self.stragglers is None or (self._stragglers_at is not None
                                       and now - self._stragglers_at < STRAGGLERS_EVERY_S):
            return
        self._stragglers_at = now
        report, me = self.stragglers(), self.position()
        if report.samples == 0 or me >= len(report.p50):
            self.m.straggler.labels(self.label).set(0)  # a new window (after a shrink) has named nobody yet
            return
        self.m.update_seconds.labels(self.label, "0.5").set(report.p50[me])
        self.m.update_seconds.labels(self.label, "0.9").set(report.p90[me])
        self.m.straggler.labels(self.label).set(1 if me in report.stragglers else 0)

    def _write(self, now: float) -> None:
        from prometheus_client import write_to_textfile

        assert self.textfile is not None
        self.textfile.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(self.textfile), self.m.registry)  # written aside, then renamed: atomic
        self._written = now
