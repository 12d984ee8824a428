"""Which exporters a runtime gets, from its config and the environment (`attach` calls this).

Always: the incident log (sentence to `logging`, evidence next to the traces) and torchelastic
events. OpenTelemetry spans when the OTEL_* variables (or an installed tracer provider) ask for
them and OpenTelemetry is installed. Prometheus when a port or a textfile is configured and
`prometheus_client` is installed; the port is per rank: `metrics_port + LOCAL_RANK`, so every
rank of a host has its own endpoint."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .elastic import ElasticEventsObserver
from .incident_log import IncidentLog
from .otel import OtelObserver, tracer_from_env

if TYPE_CHECKING:
    from ..runtime.listeners import RecoveryObserver
    from ..runtime.runtime import Runtime

log = logging.getLogger("accelpact.observe")


def observers_for(rt: Runtime, env: Mapping[str, str] | None = None) -> list[RecoveryObserver]:
    env = os.environ if env is None else env
    found: list[RecoveryObserver] = [IncidentLog(rt.config.trace_dir, rt.rank), ElasticEventsObserver()]
    otel = tracer_from_env(env)
    if otel is not None:
        found.append(OtelObserver(*otel))
    prometheus = _prometheus(rt, env)
    if prometheus is not None:
        found.append(prometheus)
    return found


def metrics_port(base: int, rank: int, env: Mapping[str, str]) -> int:
    """The rank's port: base + LOCAL_RANK (torchrun sets it; without it, the global rank)."""
    return base + int(env.get("LOCAL_RANK", rank))


def _prometheus(rt: Runtime, env: Mapping[str, str]) -> RecoveryObserver | None:
    config = rt.config
    if config.metrics_port is None and not config.metrics_textfile:
        return None
    try:
        from .metrics import PrometheusObserver, process_metrics

        process_metrics()
    except ImportError as exc:
        log.warning("metrics are configured but prometheus_client is not installed (%s): no metrics "
                    "(pip install prometheus_client, or accelpact[observe])", exc)
        return None
    def replicas() -> int:  # read at each recovery: a shrink leaves fewer
        group = rt.data_plane.gids.get("replicate")
        return len(group.ranks) if group else 1

    port = None if config.metrics_port is None else metrics_port(config.metrics_port, rt.rank, env)
    # `rt.stragglers` looked up at each read: a shrink replaces it (the old window was kept forever)
    return PrometheusObserver(rank=rt.rank, replicas=replicas, port=port,
                              textfile=config.metrics_textfile, window_s=config.metrics_window_s,
                              frontier=rt.frontier, generation=rt.generation,
                              stragglers=lambda: rt.stragglers.report(), position=lambda: rt.rank)
