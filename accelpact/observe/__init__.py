"""Where operators look: each incident as a sentence and an evidence record, Prometheus
metrics, OpenTelemetry spans and torchelastic events. Every exporter is a `RecoveryObserver`
(`accelpact.runtime.listeners`) that `attach` installs from the config and the environment;
the optional ones (prometheus_client, opentelemetry) are imported only when asked for."""

from .incident import IncidentFacts, cause_kind, sentence
from .install import observers_for

__all__ = ["IncidentFacts", "cause_kind", "observers_for", "sentence"]
