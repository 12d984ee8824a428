"""Incidents in plain words, from facts alone: the cause kind of a classified cause line, who
saw it and whom they lost, the sentence, goodput over a window, the stacks of a suspected hang,
and the report leading with one sentence per incident."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from accelpact.fsm.phases import FailurePhase, RecoveryAction
from accelpact.observe.incident import (
    IncidentFacts,
    cause_kind,
    nobody_lost,
    observers_of,
    peers_of,
    sentence,
)
from accelpact.observe.stacks import thread_stacks
from accelpact.observe.window import RollingGoodput
from accelpact.run_report import format_summary, summarize
from accelpact.runtime.evidence import evidence_of
from accelpact.runtime.history import RecoveryRecord

GLOO_TIMEOUT = "replicate[0,2]: timeout: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv"


@pytest.mark.parametrize("cause, bug, kind", [
    (GLOO_TIMEOUT, "", "timeout"),
    ("connection_closed: Connection reset by peer", "", "connection_closed"),
    ("shard[0,1]: retired_communicator: not initialized", "", "retired_communicator"),
    ("replicate[0..14:2]: timeout: waited", "", "timeout"),  # compact group keys hold a ':'
    ("shard[0,1]: other: boom; replicate[0,2]: timeout: x", "", "other"),
    ("control plane failed at the boundary: store gone", "", "control_plane"),
    ("", "ValueError: bad shape", "bug"),
    ("something new", "", "unknown"),
])
def test_cause_kind_of_a_classified_cause(cause, bug, kind):
    assert cause_kind(cause, bug=bug) == kind


def test_observers_and_the_peers_they_lost():
    reports = [{"rank": 0, "failed_groups": ["replicate[0,2]"], "failure_phase": "committed"},
               {"rank": 1, "failed_groups": [], "failure_phase": "committed"},
               {"rank": 2, "failed_groups": [], "failure_phase": "committed"},
               {"rank": 3, "failed_groups": [], "failure_phase": "backward"}, None]
    assert observers_of(reports) == [0, 3]
    assert peers_of(0, ["replicate[0,2]"], [0]) == [2]  # the silent member is the suspect
    assert peers_of(0, ["replicate[0,2]"], [0, 2]) == [2]  # both saw it: each lost the other
    assert peers_of(1, ["replicate[0,2]"], [0]) == [2]  # not a member: the group's silent members


def test_sentences_say_who_what_when_and_what_was_decided():
    preserve = IncidentFacts(update=14, phase="committed", action="preserve", observers=(0,),
                             failed_groups=("replicate[0,2]",), cause=GLOO_TIMEOUT, detect_s=2.0, repair_s=0.061)
    assert sentence(preserve) == ("rank 0 timed out waiting for rank 2 on replicate[0,2] at the committed boundary "
                                  "of update 14; every rank preserved its state; detected in 2.00 s, repaired in 61 ms")
    rewind = IncidentFacts(update=14, phase="backward", action="rewind", observers=(2, 0),
                           failed_groups=("replicate[0,2]",), cause="connection_closed: reset", detect_s=0.01,
                           repair_s=0.061, back_s=0.5)
    assert sentence(rewind) == ("rank 2 lost its link to rank 0 on replicate[0,2] (also seen by rank 0) during "
                                "backward of update 14; every rank rewound; detected in 0.01 s, repaired in 61 ms, "
                                "training past it 0.50 s after the fault")
    inside = IncidentFacts(update=2, phase="backward", action="reject", observers=(3, 0), failed_groups=(),
                           cause="timeout: Timed out waiting 2000ms", detect_s=0.2, repair_s=0.03,
                           reasons=("failure outside a committed boundary",))
    assert sentence(inside).startswith("rank 3 timed out in a collective (also seen by rank 0) during backward of "
                                       "update 2; every rank rejected (failure outside a committed boundary);")
    reject = IncidentFacts(update=3, phase="optimizer", action="reject", observers=(1,), failed_groups=(),
                           cause="", detect_s=0.0, repair_s=0.004, reasons=("ValueError: bad shape",),
                           restored_step=2)
    text = sentence(reject)
    assert text.startswith("rank 1 failed: ValueError: bad shape during the optimizer step of update 3; "
                           "every rank rejected (ValueError: bad shape), restarted from checkpoint 2;"), text
    replaced = IncidentFacts(update=4, phase="forward", action="replace", observers=(0,), failed_groups=(),
                             cause="connection_closed: reset", detect_s=0.0, repair_s=0.09)
    assert "; a spare took the lost rank's place and every rank re-ran the update;" in sentence(replaced)
    rebuilt = dataclasses.replace(replaced, nobody_lost=True)  # the control plane failed with every rank alive
    assert ("; nobody was lost: every rank rebuilt its world around the same members and re-ran the update;"
            in sentence(rebuilt)), sentence(rebuilt)
    assert nobody_lost({"lost": [], "spares": {}}) and not nobody_lost({"lost": [3]}) and not nobody_lost(None)


def test_goodput_counts_committed_time_and_drops_what_a_recovery_threw_away():
    g = RollingGoodput(window_s=100.0)
    g.start(0.0)
    assert g.ratio(0.0) is None
    for t in (1.0, 2.0, 3.0, 4.0):
        g.commit(t)
    assert g.ratio(4.0) == 1.0
    g.incident(7.0, lost_s=2.0)  # a Preserve: update 5 (4..5) counts, 5..7 detection and repair
    assert g.ratio(7.0) == pytest.approx(5.0 / 7.0)
    g.incident(9.0)  # a Rewind: the whole interrupted update is lost
    assert g.ratio(9.0) == pytest.approx(5.0 / 9.0)
    g.commit(10.0)
    assert g.ratio(10.0) == pytest.approx(6.0 / 10.0)
    # the window rolls: 100 s of clean commits later the incidents are out of it
    for t in range(11, 115):
        g.commit(float(t))
    assert g.ratio(114.0) == 1.0


def test_stacks_show_where_every_thread_is():
    release = threading.Event()

    def wait_for_peer():
        release.wait(10)

    worker = threading.Thread(target=wait_for_peer, name="loader-7")
    worker.start()
    try:
        stacks = thread_stacks()
    finally:
        release.set()
        worker.join()
    mine = [frames for name, frames in stacks.items() if name.startswith("loader-7 ")]
    assert mine and any("in wait_for_peer" in f for f in mine[0])
    assert any(any("test_stacks_show_where_every_thread_is" in f for f in frames) for frames in stacks.values())


def _record(saw: bool, cause: str, reports: list[dict]) -> RecoveryRecord:
    return RecoveryRecord(1, 3, RecoveryAction.PRESERVE, FailurePhase.COMMITTED, saw, cause, 3, 1,
                          failed_groups=["replicate[0,2]"], detect_s=2.0, repair_s=0.05, reports=reports,
                          decision={"action": "preserve"})


def test_evidence_of_a_timeout_carries_every_report_the_decision_and_the_stacks():
    from types import SimpleNamespace

    reports = [{"rank": r, "failed_groups": ["replicate[0,2]"] if r == 0 else [], "failure_phase": "committed",
                "bug": ""} for r in range(4)]
    seen = evidence_of(SimpleNamespace(rank=0, attempt=0, opt_step=3), _record(True, GLOO_TIMEOUT, reports), None)
    assert (seen.cause_kind, seen.observers, seen.peers, seen.reports, seen.decision) == (
        "timeout", [0], [2], reports, {"action": "preserve"})
    assert seen.stacks and seen.sentence.startswith("rank 0 timed out waiting for rank 2 on replicate[0,2]")
    joined = evidence_of(SimpleNamespace(rank=1, attempt=0, opt_step=3), _record(False, "", reports), None)
    assert (joined.cause_kind, joined.peers, joined.stacks) == ("peer", [], {})  # not stuck: no stacks
    assert joined.sentence.startswith("rank 0 lost contact with rank 2 on replicate[0,2]")


def _traces():
    """Two ranks; rank 0 saw a timeout at the boundary of update 2; both preserved."""
    def commit(rank, f, t):
        return {"kind": "edge", "action": "commit_update", "from": "Train", "to": "Train", "F": f, "g": 0,
                "rank": rank, "t": t, "update": f}
    out = {}
    for rank in (0, 1):
        saw = rank == 0
        out[rank] = [
            {"kind": "attach", "attempt": 0, "t": 0.0}, commit(rank, 1, 1.0),
            {"kind": "observe", "t": 4.0, "update": 2, "phase_failed": "committed", "saw": saw,
             "cause": "replicate[0,1]: timeout: waited" if saw else "", "failed_groups": ["replicate[0,1]"] if saw else []},
            {"kind": "recovery", "t": 4.05, "index": 1, "update": 2, "action": "preserve", "failure_phase": "committed",
             "frontier": 2, "generation": 1, "failed_groups": ["replicate[0,1]"], "detect_s": 2.0, "repair_s": 0.05,
             "timings_s": {"agree": 0.01}},
            commit(rank, 3, 5.0),
        ]
    return out


def test_the_report_leads_with_one_sentence_per_incident():
    text = format_summary(summarize(_traces()))
    first, second = text.splitlines()[:2]
    assert first == "incidents:"
    assert second == ("  #1 rank 0 timed out waiting for rank 1 on replicate[0,1] at the committed boundary of "
                      "update 2; every rank preserved its state; detected in 2.00 s, repaired in 50 ms, training "
                      "past it 3.00 s after the fault")
    assert "MTTD" in text  # the tables follow


def test_a_relaunchs_reject_evidence_keeps_the_last_launchs(tmp_path):
    """Attempts count from 0 again in every launch: found by review, attempt 0's evidence of the
    next launch overwrote the last one's."""
    import dataclasses
    import json

    from accelpact.runtime.evidence import Evidence, write_reject_evidence

    fields = {f.name: None for f in dataclasses.fields(Evidence)}
    first = Evidence(**{**fields, "rank": 1, "attempt": 0, "reasons": ["first launch"]})
    again = Evidence(**{**fields, "rank": 1, "attempt": 0, "reasons": ["second launch"]})
    paths = [write_reject_evidence(str(tmp_path), e) for e in (first, again)]
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["reject-rank1-attempt0.json", "reject-rank1-attempt0-2.json"]
    assert [json.loads(open(p).read())["reasons"] for p in paths] == [["first launch"], ["second launch"]]
