"""A faulted 4-rank run, observed the way an operator would: the Prometheus endpoint of every
rank scraped while the run is alive, every incident an OpenTelemetry span (in-memory exporter
in each rank) and an evidence line, and `accelpact report` leading with one sentence each."""

from __future__ import annotations

import http.client
import os
import random
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world

pytestmark = pytest.mark.multiproc

FAULTS = "skip@3:committed:2,skip@5:committed:1"  # rank 0 loses rank 2, then rank 3 loses rank 1
UPDATES = 6


def _observed_rank(rank: int, world_size: int, drill: Drill, marker: str) -> dict:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    out = run_drill(rank, world_size, drill)
    deadline = time.monotonic() + 60  # stay alive (the endpoint with us) until the test has scraped
    while not Path(marker).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    out["spans"] = [{"name": s.name, "parent": s.parent.span_id if s.parent else None, "id": s.context.span_id,
                     "attributes": dict(s.attributes), "status": s.status.status_code.name}
                    for s in exporter.get_finished_spans()]
    return out


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (gloo's and the store's
    sockets take them all run long): a metrics port drawn there can be taken between our check
    and the rank's bind."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_base(n: int) -> int:
    top = min(_ephemeral_low(), 32768) - n - 1
    for _ in range(50):
        base = random.randint(20000, top)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _parse(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _scrape_until_done(base: int, marker: Path, scrapes: dict[int, dict[str, float]], stop: threading.Event,
                       errors: dict[int, str]):
    """Scrape every rank until each shows its final committed count, then let the ranks go.
    A scrape that fails (refused while the rank starts, cut short on a loaded machine) is
    retried; the last failure per rank is kept for the test's message."""
    while not stop.is_set():
        for rank in range(4):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=2) as got:
                    scrapes[rank] = _parse(got.read().decode())
            except (OSError, http.client.HTTPException, ValueError, IndexError) as exc:
                errors[rank] = f"{type(exc).__name__}: {exc}"
                continue
        if len(scrapes) == 4 and all(
                s.get(f'accelpact_committed_updates_total{{rank="{r}"}}') == UPDATES for r, s in scrapes.items()):
            marker.write_text("scraped")
            return
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_a_faulted_run_is_scraped_traced_and_explained(tmp_path, capsys):
    trace_dir = tmp_path / "trace"
    marker = tmp_path / "scraped"
    base = _free_base(4)
    drill = Drill(updates=UPDATES, faults=FAULTS, data_timeout_s=2.0, control_timeout_s=12.0, reference=False,
                  trace_dir=str(trace_dir))
    scrapes: dict[int, dict[str, float]] = {}
    errors: dict[int, str] = {}
    stop = threading.Event()
    poller = threading.Thread(target=_scrape_until_done, args=(base, marker, scrapes, stop, errors), daemon=True)
    poller.start()
    env = {"ACCELPACT_METRICS_PORT": str(base), "ACCELPACT_METRICS_TEXTFILE": str(tmp_path / "prom" / "{rank}.prom")}
    try:
        results = run_world(_observed_rank, 4, drill, str(marker), timeout_s=150, pg_timeout_s=30, env=env,
                            local_world_size=4)
    finally:
        stop.set()
        poller.join(5)
    committed = {r: s.get(f'accelpact_committed_updates_total{{rank="{r}"}}') for r, s in scrapes.items()}
    assert marker.exists(), (f"the endpoints never showed {UPDATES} commits: committed {committed}, last scrape "
                             f"errors {errors}, histories {[r['history'] for r in results]}")
    for r in results:
        assert r["rejected"] is None, r["rejected"]
    planned = {3: (0, 2, "replicate[0,2]"), 5: (3, 1, "replicate[1,3]")}  # update: observer, peer, group
    preserves = {r["rank"]: [h for h in r["history"] if h["update"] in planned] for r in results}
    assert all(len(h) == 2 for h in preserves.values()), preserves  # (a spurious extra one is load, allowed)
    n_recoveries = len(results[0]["history"])

    # Prometheus, scraped from the live ranks
    for rank, s in scrapes.items():
        lab = f'rank="{rank}"'
        assert s[f"accelpact_committed_updates_total{{{lab}}}"] == UPDATES
        assert s[f"accelpact_generation{{{lab}}}"] == n_recoveries
        assert s[f"accelpact_replicas{{{lab}}}"] == 2
        assert 0.0 < s[f"accelpact_goodput_ratio{{{lab}}}"] < 1.0  # two detections of ~2 s each were lost
        by_cause = {k: v for k, v in s.items() if k.startswith("accelpact_recoveries_total{")}
        assert sum(by_cause.values()) == n_recoveries
        observed = [u for u, (obs, _, _) in planned.items() if obs == rank]
        if observed:
            assert s[f'accelpact_recoveries_total{{action="preserve",cause="timeout",{lab}}}'] >= len(observed)
        assert s[f'accelpact_incident_lost_seconds_count{{{lab},stage="repair"}}'] == n_recoveries
        assert s[f'accelpact_incident_lost_seconds_sum{{{lab},stage="detect"}}'] >= 2 * 1.5
        assert s[f'accelpact_incident_lost_seconds_count{{{lab},stage="first_update"}}'] == n_recoveries
    assert (tmp_path / "prom" / "2.prom").read_text().count("accelpact_committed_updates_total{") == 1

    # OpenTelemetry: one span per incident with the facts, detect and repair as its children
    for r in results:
        tops = [s for s in r["spans"] if s["parent"] is None]
        assert [s["name"] for s in tops] == [f"accelpact.{h['action']}" for h in r["history"]]
        for update, (observer, peer, group) in planned.items():
            span = next(s for s in tops if s["attributes"]["accelpact.update"] == update)
            assert group in span["attributes"]["accelpact.failed_groups"]
            assert span["attributes"]["accelpact.failure.cause_kind"] == ("timeout" if r["rank"] == observer else "peer")
            # the observer knows the cause; a rank that only joined knows who saw what, not why
            verb = "timed out waiting for" if r["rank"] == observer else "lost contact with"
            assert f"rank {observer} {verb} rank {peer} on {group}" in span["attributes"]["accelpact.sentence"]
            kids = {s["name"] for s in r["spans"] if s["parent"] == span["id"]}
            assert kids == {"accelpact.detect", "accelpact.repair"}

    # the evidence: every rank's reports and the decision; stacks where the timeout was seen
    import json

    first = [json.loads(x) for x in (trace_dir / "incidents-rank0.jsonl").read_text().splitlines()]
    ev = next(e for e in first if e["update"] == 3)
    assert [rep["rank"] for rep in ev["reports"]] == [0, 1, 2, 3] and ev["decision"]["action"] == "preserve"
    assert ev["stacks"] and ev["peers"] == [2] and ev["cause_kind"] == "timeout"

    # the report leads with one sentence per incident
    from accelpact import cli

    capsys.readouterr()
    assert cli.main(["report", str(trace_dir), "--no-plot"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "incidents:"
    for update, (observer, peer, group) in planned.items():
        assert any(f"rank {observer} timed out waiting for rank {peer} on {group} at the committed boundary of "
                   f"update {update}; every rank preserved its state" in line for line in lines[1:8]), text
    assert "stacks of every thread (suspected hang): rank 0" in text
    assert os.path.exists(trace_dir / "incidents-rank3.jsonl")
