"""The exporters alone, in one process: the observer fan-out, Prometheus counters on a fake
clock and the per-rank textfile, OpenTelemetry spans (an in-memory exporter; the standard
variables), torchelastic events, and the paths where prometheus_client or opentelemetry is
missing (nothing exported, nothing fails)."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace

import pytest

from accelpact.config import Config, unknown_variables
from accelpact.observe import metrics as prom
from accelpact.observe import otel
from accelpact.observe.elastic import ElasticEventsObserver
from accelpact.observe.incident_log import IncidentLog
from accelpact.observe.install import metrics_port, observers_for
from accelpact.runtime.evidence import Evidence
from accelpact.runtime.listeners import Observers, RecoveryObserver


def _evidence(action="preserve", phase="committed", cause_kind="timeout", **kw) -> Evidence:
    base = dict(rank=0, attempt=0, index=1, update=3, action=action, phase=phase, saw_failure=True,
                cause="replicate[0,2]: timeout: waited", cause_kind=cause_kind, failed_groups=["replicate[0,2]"],
                observers=[0], peers=[2], reports=[], decision=None, reasons=[], frontier=3, generation=1,
                opt_step=3, detect_s=2.0, repair_s=0.05, timings_s={"agree": 0.01, "rebind": 0.02}, error=None,
                sentence="rank 0 timed out waiting for rank 2 on replicate[0,2] ...", wall_time=1_000.0, t=50.0)
    base.update(kw)
    return Evidence(**base)


class _Recorder:
    def __init__(self):
        self.calls = []

    def on_commit(self, frontier, generation):
        self.calls.append(("commit", frontier))

    def on_recovery(self, evidence):
        self.calls.append(("recovery", evidence.action))

    def on_reject(self, evidence):
        self.calls.append(("reject", evidence.action))

    def close(self):
        self.calls.append(("close",))


class _Broken(_Recorder):
    def on_commit(self, frontier, generation):
        raise RuntimeError("exporter down")


def test_a_failing_observer_is_logged_and_the_others_still_hear(caplog):
    observers, seen = Observers(), _Recorder()
    observers.add(_Broken())
    observers.add(seen)
    with pytest.raises(TypeError):
        observers.add(object())
    with caplog.at_level(logging.WARNING, logger="accelpact.runtime"):
        observers.commit(1, 0)
    observers.recovered(_evidence())
    observers.rejected(_evidence(action="reject"))
    observers.close()
    assert seen.calls == [("commit", 1), ("recovery", "preserve"), ("reject", "reject"), ("close",)]
    assert "exporter down" in caplog.text  # the cause is kept
    assert isinstance(seen, RecoveryObserver)


def test_checkpoint_outcomes_reach_the_observers_that_listen_for_them(tmp_path):
    """`on_checkpoint` is optional: an observer without it (the recorder) is skipped, not broken;
    Prometheus counts saves by outcome and keeps the newest published step."""
    observers, seen = Observers(), _Recorder()
    obs = prom.PrometheusObserver(rank=5, replicas=2, textfile=str(tmp_path / "c.prom"))
    observers.add(seen)
    observers.add(obs)
    observers.checkpoint(2, None)
    observers.checkpoint(4, "CheckpointSaveError: writing rank state for step 4 failed on 1 of 4 rank(s)")
    observers.checkpoint(6, None)
    assert seen.calls == []
    assert _sample("accelpact_checkpoint_saves_total", rank="5", outcome="published") == 2
    assert _sample("accelpact_checkpoint_saves_total", rank="5", outcome="failed") == 1
    assert _sample("accelpact_checkpoint_step", rank="5") == 6
    assert 'accelpact_checkpoint_saves_total{outcome="failed",rank="5"} 1.0' in (tmp_path / "c-rank5.prom").read_text()


def _sample(name, **labels):
    m = prom.process_metrics()
    return m.registry.get_sample_value(name, labels)


def test_prometheus_counts_commits_recoveries_time_lost_and_goodput(tmp_path):
    now = [100.0]
    obs = prom.PrometheusObserver(rank=7, replicas=2, textfile=str(tmp_path / "m.prom"), window_s=60.0,
                                  clock=lambda: now[0])
    for f in (1, 2):
        now[0] += 1.0
        obs.on_commit(f, 0)
    now[0] += 3.0  # update 3 took 1 s, detect 1.95 s, repair 0.05 s; Preserve commits it
    obs.on_recovery(_evidence(rank=7, detect_s=1.95, repair_s=0.05))
    now[0] += 1.5
    obs.on_commit(4, 1)
    assert _sample("accelpact_committed_updates_total", rank="7") == 4  # 3 commits + the preserved update
    assert _sample("accelpact_recoveries_total", rank="7", action="preserve", cause="timeout") == 1
    assert _sample("accelpact_incident_lost_seconds_sum", rank="7", stage="detect") == pytest.approx(1.95)
    assert _sample("accelpact_incident_lost_seconds_sum", rank="7", stage="repair") == pytest.approx(0.05)
    assert _sample("accelpact_incident_lost_seconds_sum", rank="7", stage="first_update") == pytest.approx(1.5)
    assert _sample("accelpact_goodput_ratio", rank="7") == pytest.approx((6.5 - 2.0) / 6.5)
    assert (_sample("accelpact_generation", rank="7"), _sample("accelpact_replicas", rank="7")) == (1, 2)
    assert _sample("accelpact_frontier", rank="7") == 4
    now[0] += 1.0  # a Rewind inside an update: detection counts from the update's start
    obs.on_recovery(_evidence(rank=7, action="rewind", phase="backward", cause_kind="connection_closed",
                              detect_s=0.001, repair_s=0.2, frontier=4, generation=2))
    assert _sample("accelpact_incident_lost_seconds_sum", rank="7", stage="detect") == pytest.approx(1.95 + 0.8)
    assert _sample("accelpact_committed_updates_total", rank="7") == 4
    obs.close()
    text = (tmp_path / "m-rank7.prom").read_text()
    assert 'accelpact_recoveries_total{action="rewind",cause="connection_closed",rank="7"} 1.0' in text


def test_the_straggler_signal_is_a_metric_refreshed_at_most_once_a_second():
    from accelpact.stragglers import StragglerWindow

    window = StragglerWindow(3, window=2, factor=1.5)
    asked = []

    def report():
        asked.append(1)
        return window.report()

    now = [10.0]
    obs = prom.PrometheusObserver(rank=2, replicas=1, clock=lambda: now[0], stragglers=report)
    obs.on_commit(1, 0)  # nothing measured yet: no gauge
    assert _sample("accelpact_update_seconds", rank="2", quantile="0.5") is None
    for times in ((0.1, 0.1, 0.4), (0.1, 0.1, 0.5)):
        window.add(times)
    now[0] += 0.5
    obs.on_commit(2, 0)  # within a second of the last refresh: the report is not asked again
    assert len(asked) == 1
    now[0] += 1.0
    obs.on_commit(3, 0)
    assert _sample("accelpact_update_seconds", rank="2", quantile="0.5") == pytest.approx(window.report().p50[2])
    assert _sample("accelpact_update_seconds", rank="2", quantile="0.9") == pytest.approx(window.report().p90[2])
    assert _sample("accelpact_straggler", rank="2") == 1  # 0.45 s median against its peers' 0.1 s


def test_textfile_paths_are_one_per_rank(tmp_path):
    assert prom.textfile_path(str(tmp_path / "x-{rank}.prom"), 3) == tmp_path / "x-3.prom"
    assert prom.textfile_path(str(tmp_path), 3) == tmp_path / "accelpact-rank3.prom"
    assert prom.textfile_path(str(tmp_path / "job.prom"), 0) == tmp_path / "job-rank0.prom"
    assert metrics_port(9400, 5, {"LOCAL_RANK": "1"}) == 9401 and metrics_port(9400, 5, {}) == 9405


def test_metrics_settings_are_config_fields_and_known_variables():
    env = {"ACCELPACT_METRICS_PORT": "9400", "ACCELPACT_METRICS_TEXTFILE": "/tmp/m.prom",
           "ACCELPACT_METRICS_WINDOW_S": "60"}
    config = Config().with_env(env)
    assert (config.metrics_port, config.metrics_textfile, config.metrics_window_s) == (9400, "/tmp/m.prom", 60.0)
    assert unknown_variables(env) == []
    with pytest.raises(Exception, match="metrics_port"):
        Config(metrics_port=70000)


@pytest.fixture(scope="module")
def spans():
    """The process's tracer provider, with an in-memory exporter (set once per process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def test_each_incident_is_a_span_with_detect_and_repair_children(spans):
    spans.clear()
    found = otel.tracer_from_env({})  # the application's provider is used as it is
    assert found is not None and found[1] is None
    obs = otel.OtelObserver(*found)
    obs.on_recovery(_evidence())
    error = {"type": "ValueError", "message": "bad shape", "traceback": "Traceback ..."}
    obs.on_reject(_evidence(action="reject", cause_kind="bug", reasons=["ValueError: bad shape"], error=error))
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"accelpact.preserve", "accelpact.reject", "accelpact.detect", "accelpact.repair"}
    preserve = by_name["accelpact.preserve"]
    assert preserve.attributes["accelpact.failure.cause_kind"] == "timeout"
    assert tuple(preserve.attributes["accelpact.failed_groups"]) == ("replicate[0,2]",)
    assert tuple(preserve.attributes["accelpact.peers"]) == (2,)
    assert (preserve.end_time - preserve.start_time) / 1e9 == pytest.approx(2.05)
    assert preserve.events[0].attributes["sentence"].startswith("rank 0 timed out")
    reject = by_name["accelpact.reject"]
    assert reject.status.status_code.name == "ERROR" and "bad shape" in reject.status.description
    assert [e.name for e in reject.events] == ["accelpact.incident", "exception"]
    children = [s for s in spans.get_finished_spans() if s.parent is not None]
    assert {s.parent.span_id for s in children} == {preserve.context.span_id, reject.context.span_id}
    repair = next(s for s in children if s.name == "accelpact.repair")
    assert repair.attributes["accelpact.phase_ms.rebind"] == pytest.approx(20.0)


def test_a_span_leaves_the_trainers_random_stream_alone(spans):
    import random

    random.seed(5)
    expected = random.random()
    random.seed(5)
    otel.OtelObserver(*otel.tracer_from_env({})).on_recovery(_evidence())
    assert spans.get_finished_spans() and random.random() == expected


def test_the_standard_variables_decide_whether_there_are_spans(monkeypatch, capfd):
    from opentelemetry import trace

    assert otel.tracer_from_env({"OTEL_SDK_DISABLED": "true"}) is None
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert otel.tracer_from_env({}) is None  # nothing asked for: no spans
    assert otel.tracer_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    tracer, provider = otel.tracer_from_env({"OTEL_TRACES_EXPORTER": "console"})
    obs = otel.OtelObserver(tracer, provider)
    obs.on_recovery(_evidence())
    obs.close()  # our own provider: flushed at close
    assert '"name": "accelpact.preserve"' in capfd.readouterr().out


def test_without_opentelemetry_nothing_is_exported_and_nothing_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry → ImportError
    assert otel.tracer_from_env({"OTEL_TRACES_EXPORTER": "otlp"}) is None


@pytest.fixture
def no_tracer_provider(monkeypatch):
    from opentelemetry import trace

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())


def _runtime(tmp_path, **config):
    return SimpleNamespace(rank=0, frontier=0, generation=0, config=Config(trace_dir=str(tmp_path), **config),
                           data_plane=SimpleNamespace(gids={}))


def test_without_prometheus_client_metrics_are_skipped_with_a_warning(monkeypatch, tmp_path, caplog,
                                                                     no_tracer_provider):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setattr(prom, "_process", None)
    with caplog.at_level(logging.WARNING, logger="accelpact.observe"):
        found = observers_for(_runtime(tmp_path, metrics_textfile=str(tmp_path / "m.prom")), env={})
    assert [type(o).__name__ for o in found] == ["IncidentLog", "ElasticEventsObserver"]
    assert "prometheus_client is not installed" in caplog.text


def test_by_default_the_incident_log_and_elastic_events_only(tmp_path, no_tracer_provider):
    found = observers_for(_runtime(tmp_path), env={})
    assert [type(o).__name__ for o in found] == ["IncidentLog", "ElasticEventsObserver"]


def test_incidents_are_torchelastic_worker_events_and_evidence_lines(tmp_path, caplog):
    from torch.distributed.elastic.events import _get_or_create_logger

    got = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(json.loads(record.getMessage()))
    events_logger = _get_or_create_logger("null")  # where torchrun's own agent records its events
    events_logger.addHandler(handler)
    try:
        ElasticEventsObserver().on_recovery(_evidence())
    finally:
        events_logger.removeHandler(handler)
    assert got[0]["name"] == "accelpact.preserve" and got[0]["source"] == "WORKER"
    assert got[0]["metadata"]["failed_groups"] == "replicate[0,2]" and got[0]["timestamp"] == 1_000_000
    log = IncidentLog(str(tmp_path), 0)
    with caplog.at_level(logging.INFO, logger="accelpact.incident"):
        log.on_recovery(_evidence())
        log.on_reject(_evidence(action="reject"))
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "incidents-rank0.jsonl").read_text().splitlines()]
    assert [x["action"] for x in lines] == ["preserve", "reject"] and lines[0]["peers"] == [2]
    assert "rank 0 timed out waiting for rank 2" in caplog.text


def test_a_rejects_span_is_exported_before_the_fail_stop_exit(monkeypatch, capfd):
    """A reject ends in `os._exit(75)`, which runs no exit handler: a batching span processor never
    sent the span that says why (found by review; 0 spans exported)."""
    from opentelemetry import trace

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    tracer, provider = otel.tracer_from_env({"OTEL_TRACES_EXPORTER": "console"})  # a BatchSpanProcessor
    obs = otel.OtelObserver(tracer, provider)
    obs.on_recovery(_evidence())
    assert '"name"' not in capfd.readouterr().out  # batched: nothing sent yet
    obs.on_reject(_evidence(action="reject", cause_kind="bug", reasons=["ValueError: bad shape"]))
    out = capfd.readouterr().out  # no close(): the process would exit now
    assert '"name": "accelpact.reject"' in out and '"name": "accelpact.preserve"' in out


def test_after_a_shrink_the_replicas_gauge_and_the_straggler_window_are_the_smaller_worlds():
    """Found by review: both were bound at attach, so after a shrink `accelpact_replicas` kept the
    old count and the straggler gauges read the discarded window forever."""
    from accelpact.stragglers import StragglerReport

    now = [10.0]
    replicas, window = [3], ["old"]
    reports = {"old": StragglerReport(samples=20, window=20, factor=2.0, p50=(0.1,) * 6, p90=(0.1,) * 6,
                                      stragglers=(5,)),
               "new": StragglerReport(samples=0, window=20, factor=2.0, p50=(0.1,) * 4, p90=(0.1,) * 4,
                                      stragglers=())}
    position = [5]
    obs = prom.PrometheusObserver(rank=5, replicas=lambda: replicas[0], clock=lambda: now[0],
                                  stragglers=lambda: reports[window[0]], position=lambda: position[0])
    now[0] += 2.0
    obs.on_commit(1, 0)
    assert _sample("accelpact_replicas", rank="5") == 3 and _sample("accelpact_straggler", rank="5") == 1
    replicas[0], window[0], position[0] = 2, "new", 3  # the shrink: fewer replicas, renumbered, a new window
    obs.on_recovery(_evidence(rank=5, action="shrink", detect_s=0.5, repair_s=0.1))
    now[0] += 0.1  # within the once-a-second refresh: a recovery makes the next commit read it
    obs.on_commit(2, 1)
    assert _sample("accelpact_replicas", rank="5") == 2 and _sample("accelpact_straggler", rank="5") == 0


def test_a_deferred_commit_is_timed_to_its_updates_end_so_a_hang_after_it_counts_as_detection():
    """Found by review (left out last round): with deferred boundaries update 2 is agreed during
    update 3; when update 3 hangs, its commit came after the hang, so the hang counted as update
    2's productive time and its detection as ~0."""
    now = [100.0]
    obs = prom.PrometheusObserver(rank=11, replicas=1, window_s=60.0, clock=lambda: now[0])
    now[0] += 1.0
    obs.on_commit(1, 0)  # synchronous: at its end
    now[0] = 103.8  # update 2's body ended at 102.0; update 3 hung until its data timeout
    observers = Observers()
    observers.add(obs)
    observers.commit(2, 0, late_s=1.8)
    now[0] = 104.0
    obs.on_recovery(_evidence(rank=11, action="rewind", phase="forward", detect_s=0.001, repair_s=0.2,
                              frontier=2, generation=1))
    assert _sample("accelpact_incident_lost_seconds_sum", rank="11", stage="detect") == pytest.approx(1.8)
    assert _sample("accelpact_goodput_ratio", rank="11") == pytest.approx(2.0 / 4.0)
    assert _sample("accelpact_committed_updates_total", rank="11") == 2


def test_an_observer_without_on_late_commit_hears_a_late_commit_as_a_commit():
    heard = []

    class Plain:
        def on_commit(self, frontier, generation):
            heard.append(("commit", frontier))

        def on_recovery(self, evidence): ...

        def on_reject(self, evidence): ...

        def close(self): ...

    class Timing(Plain):
        def on_late_commit(self, frontier, generation, late_s):
            heard.append(("late", frontier, late_s))

    observers = Observers()
    observers.add(Plain())
    observers.add(Timing())
    observers.commit(3, 0, late_s=0.25)
    observers.commit(4, 0)
    assert heard == [("commit", 3), ("late", 3, 0.25), ("commit", 4), ("commit", 4)]
