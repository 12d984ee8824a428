"""Recoveries and rejects as OpenTelemetry spans, configured the ecosystem's way.

No hard dependency: without `opentelemetry` nothing is exported and nothing fails. Which
tracer is used follows the standard variables: OTEL_SDK_DISABLED=true turns it off; a tracer
provider the application (or `opentelemetry-instrument`) already installed is used as it is;
otherwise OTEL_TRACES_EXPORTER (otlp, console; default otlp when OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set) builds a provider of our own from the SDK, with the
resource the SDK reads from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES. With none of these,
no spans (the API's no-op would cost a call per incident for nothing)."""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime.evidence import Evidence

log = logging.getLogger("accelpact.observe")

SCOPE = "accelpact"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def tracer_from_env(env: Mapping[str, str]) -> tuple[Any, Any] | None:
    """(tracer, provider we own or None), or None when spans are off or OTel is not installed."""
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return current.get_tracer(SCOPE), None  # the application's: it exports and flushes
    names = env.get("OTEL_TRACES_EXPORTER")
    if names is None and (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = "otlp"
    exporters = [e for e in (n.strip().lower() for n in (names or "").split(",")) if e and e != "none"]
    if not exporters:
        return None
    provider = _provider(exporters, env)
    return (provider.get_tracer(SCOPE), provider) if provider is not None else None


def _provider(exporters: list[str], env: Mapping[str, str]) -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        log.warning("OTEL_TRACES_EXPORTER asks for %s but opentelemetry-sdk is not installed (%s): no spans",
                    ",".join(exporters), exc)
        return None
    # the SDK reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES; "accelpact" only when neither names one
    named = "OTEL_SERVICE_NAME" in env or "service.name" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "accelpact"}))
    for name in exporters:
        # out: today's sys.stdout, not the one bound when the SDK module was first imported
        exporter = ConsoleSpanExporter(out=sys.stdout) if name == "console" else _otlp(env) if name == "otlp" else None
        if exporter is None:
            log.warning("OpenTelemetry traces exporter %r is not available here: skipped", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _otlp(env: Mapping[str, str]) -> Any:
    grpc = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")) == "grpc"
    try:
        if grpc:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        log.warning("OTLP trace exporter not installed (%s): pip install opentelemetry-exporter-otlp", exc)
        return None
    return OTLPSpanExporter()  # endpoint, headers, timeout: from the OTEL_EXPORTER_OTLP_* variables


#: How long a reject waits for its span to be exported before the process exits.
REJECT_FLUSH_MS = 5000


class OtelObserver:
    """A `RecoveryObserver`: one span per incident, with detect and repair as child spans."""

    def __init__(self, tracer: Any, provider: Any = None):
        self.tracer, self.provider = tracer, provider

    def on_commit(self, frontier: int, generation: int) -> None:
        """Commits are metrics, not spans (one per update would drown the incidents)."""

    def on_recovery(self, evidence: Evidence) -> None:
        self._span(evidence)

    def on_reject(self, evidence: Evidence) -> None:
        """A reject ends in `fail_stop`'s `os._exit` (exit 75): the batch processor would never
        send the span that says why. Flush it now, the application's provider too, bounded."""
        self._span(evidence)
        from opentelemetry import trace

        provider = self.provider if self.provider is not None else trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            try:
                flush(timeout_millis=REJECT_FLUSH_MS)
            except Exception as exc:  # noqa: BLE001 - an exporter's failure must not change the reject
                log.warning("OpenTelemetry spans not flushed before the reject: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        if self.provider is not None:
            self.provider.force_flush()

    def _span(self, ev: Evidence) -> None:
        # the SDK draws span and trace ids from the global `random`: a span must not move the
        # trainer's random stream (the demo's bitwise verdict compares it)
        state = random.getstate()
        try:
            self._spans(ev)
        finally:
            random.setstate(state)

    def _spans(self, ev: Evidence) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        end = int(ev.wall_time * 1e9)
        start = end - int((ev.detect_s + ev.repair_s) * 1e9)
        span = self.tracer.start_span(f"accelpact.{ev.action}", start_time=start, attributes=attributes(ev))
        span.add_event("accelpact.incident", {"sentence": ev.sentence}, timestamp=end)
        if ev.error is not None:  # semantic conventions for exceptions
            span.add_event("exception", {"exception.type": ev.error["type"], "exception.message": ev.error["message"],
                                         "exception.stacktrace": ev.error["traceback"]}, timestamp=end)
        if ev.action == "reject":
            span.set_status(Status(StatusCode.ERROR, "; ".join(ev.reasons)[:500]))
        ctx = trace.set_span_in_context(span)
        self.tracer.start_span("accelpact.detect", context=ctx, start_time=start).end(
            end_time=start + int(ev.detect_s * 1e9))
        repair = self.tracer.start_span("accelpact.repair", context=ctx, start_time=end - int(ev.repair_s * 1e9),
                                        attributes={f"accelpact.phase_ms.{k}": v * 1e3 for k, v in ev.timings_s.items()})
        repair.end(end_time=end)
        span.end(end_time=end)


def attributes(ev: Evidence) -> dict[str, Any]:
    """The span's attributes: flat, typed as OTel allows (str, bool, int, float, lists of one)."""
    return {
        "accelpact.rank": ev.rank, "accelpact.attempt": ev.attempt, "accelpact.recovery.index": ev.index,
        "accelpact.update": ev.update, "accelpact.action": ev.action, "accelpact.failure.phase": ev.phase,
        "accelpact.failure.saw": ev.saw_failure, "accelpact.failure.cause_kind": ev.cause_kind,
        "accelpact.failure.cause": ev.cause[:1000], "accelpact.failed_groups": list(ev.failed_groups),
        "accelpact.observers": list(ev.observers), "accelpact.peers": list(ev.peers),
        "accelpact.frontier": ev.frontier, "accelpact.generation": ev.generation,
        "accelpact.detect_s": ev.detect_s, "accelpact.repair_s": ev.repair_s,
        "accelpact.reasons": [r[:500] for r in ev.reasons], "accelpact.sentence": ev.sentence,
        "accelpact.stacks_captured": bool(ev.stacks),
    }
