"""Probing a returning link with fresh connections (`control.reach`, `fsm.link_wait`,
`runtime.link_wait`): a rank that saw a failure sends its boundary check once every peer host
answers a new connection, within a budget that leaves the check's deadline where it was."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
import threading
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from accelpact.config import Config
from accelpact.control import reach
from accelpact.errors import ConfigError
from accelpact.fsm.link_wait import LinkWaitPlan, check_timeout_after, plan_link_wait
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.muted_host import MutedHost
from accelpact.testing.spawn import run_world
from model_checking.trace_validation import assert_valid_run

# ---------------------------------------------------------------------------- decision (pure) --


def plan(**kw) -> LinkWaitPlan:
    args = dict(saw_failure=True, probe_interval_s=0.01, remote_hosts=3, data_timeout_s=2.0, control_timeout_s=6.5)
    return plan_link_wait(**{**args, **kw})


def test_only_a_rank_that_saw_a_failure_waits_and_never_past_what_the_timeouts_leave():
    assert plan().budget_s == pytest.approx(2.5)  # C - 2D: the last post stays in the first poster's window
    assert plan(saw_failure=False).budget_s == 0  # a clean boundary never gets slower
    assert plan(probe_interval_s=0).budget_s == 0  # off
    assert plan(remote_hosts=0).budget_s == 0  # one host: no link a cut could take
    no_room = plan(control_timeout_s=4.0)
    assert no_room.budget_s == 0 and "leaves no time" in no_room.why


def test_the_check_gets_what_is_left_of_the_control_timeout():
    p = plan()
    assert check_timeout_after(waited_s=0.4, plan=p, control_timeout_s=6.5) == pytest.approx(6.1)
    # the last round may end after the budget: the check still gets C - budget (two data timeouts)
    assert check_timeout_after(waited_s=2.6, plan=p, control_timeout_s=6.5) == pytest.approx(4.0)
    assert check_timeout_after(waited_s=0.0, plan=plan(saw_failure=False), control_timeout_s=6.5) == 6.5


@given(data=st.floats(0.01, 100), margin=st.floats(0.001, 600), spent=st.floats(0, 1.5))
def test_the_wait_moves_no_deadline(data, margin, spent):
    """For every pair of timeouts a Config accepts (C > D): the check still fails when it would have
    without the wait (up to one probe round past the budget), the last rank's post stays inside the
    earliest poster's window, and the check keeps at least two data timeouts."""
    control = data + margin
    p = plan(data_timeout_s=data, control_timeout_s=control)
    waited = spent * p.budget_s
    timeout = check_timeout_after(waited_s=waited, plan=p, control_timeout_s=control)
    assert waited + timeout <= control + max(0.0, waited - p.budget_s) + 1e-9
    assert p.budget_s == 0 or 2 * data + p.budget_s <= control + 1e-9
    assert timeout >= min(control, 2 * data) - 1e-9


def test_the_table_keeps_one_listener_per_remote_host():
    table = reach.parse_addresses(["10.0.0.1:5000", "10.0.0.1:5001", "10.0.0.2:6000", "", "10.0.0.2:6001",
                                   "[fd00::3]:7000", "garbage"], rank=1)
    assert table.own == "10.0.0.1"  # its own host's peers share no link with it that a cut could take
    assert table.targets == {"10.0.0.2": ("10.0.0.2", 6000), "fd00::3": ("fd00::3", 7000)}
    assert reach.parse_addresses(["", "10.0.0.2:6000"], rank=0).targets == {"10.0.0.2": ("10.0.0.2", 6000)}


def test_a_bad_setting_is_refused_by_name():
    for bad in (-0.1, 2, "fast", True):
        with pytest.raises(ConfigError, match="link_probe_s"):
            Config(link_probe_s=bad)
    assert Config().with_env({"ACCELPACT_LINK_PROBE_S": "0"}).link_probe_s == 0


# ------------------------------------------------------------------------- probes (sockets) --

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_host_answers_by_accepting_or_by_refusing():
    listener = reach.ReachListener("127.0.0.1")
    try:
        got = reach.probe({"up": listener.address, "no-listener": ("127.0.0.1", free_port())},
                          budget_s=1.0, interval_s=0.01)
        assert got.reached == ("no-listener", "up") and got.unreached == () and got.rounds == 1
    finally:
        listener.close()


def test_a_silent_host_is_tried_afresh_every_round_until_the_budget_ends():
    host = MutedHost()
    try:
        got = reach.probe({"cut": host.address}, budget_s=0.3, interval_s=0.02)
        assert got.reached == () and got.unreached == ("cut",)
        assert 0.3 <= got.waited_s < 0.6 and got.rounds >= 10
    finally:
        host.close()


def test_a_wait_ends_when_its_world_is_being_abandoned():
    host = MutedHost()
    try:
        calls = []
        got = reach.probe({"cut": host.address}, budget_s=5.0, interval_s=0.01,
                          stop=lambda: calls.append(1) or len(calls) >= 3)
        assert got.unreached == ("cut",) and len(calls) == 3 and got.waited_s < 1.0
        # asked every STOP_POLL_S, not every 10 ms round: `stop` is a store round trip under spares
        assert got.rounds > len(calls) and got.waited_s >= 3 * reach.STOP_POLL_S * 0.9
    finally:
        host.close()


def test_no_round_waits_past_the_budget_but_the_first_gets_its_whole_interval():
    host = MutedHost()
    try:
        got = reach.probe({"cut": host.address}, budget_s=0.1, interval_s=0.25)
        assert got.rounds == 1 and 0.25 <= got.waited_s < 0.45  # the first round: a full interval
        got = reach.probe({"cut": host.address}, budget_s=0.3, interval_s=0.25)
        assert got.rounds == 2 and 0.3 <= got.waited_s < 0.45  # the second is cut at the budget
    finally:
        host.close()


def test_a_round_to_many_hosts_hears_them_even_when_sending_outlasts_the_interval(monkeypatch):
    """Sending to 600 hosts takes longer than a 1 ms interval: every slice's window starts once it
    was sent, so all of them are heard in the first round (a window counted from the round's start
    had closed before the first poll: nobody ever answered). At most MAX_IN_FLIGHT are open."""
    listener = reach.ReachListener("127.0.0.1")
    monkeypatch.setattr(reach, "MAX_IN_FLIGHT", 50)
    opened, most = [0], [0]
    real_socket = socket.socket

    prober = threading.current_thread()

    class Counted(real_socket):  # counts the prober's sockets (the listener's thread accepts through it too)
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.counted = threading.current_thread() is prober
            if self.counted:
                opened[0] += 1
                most[0] = max(most[0], opened[0])

        def close(self):
            if self.counted and self.fileno() >= 0:
                opened[0] -= 1
            super().close()

    monkeypatch.setattr(reach.socket, "socket", Counted)
    try:
        targets = {f"host{i}": listener.address for i in range(600)}
        got = reach.probe(targets, budget_s=0, interval_s=0.001)
        assert got.rounds == 1 and len(got.reached) == 600 and got.unreached == ()
        assert most[0] <= 50 and opened[0] == 0
    finally:
        listener.close()


def test_a_connect_that_sent_nothing_is_no_answer(monkeypatch):
    """connect() failing with EAGAIN (no local port free) sent no SYN; poll() then calls the bare
    socket writable with no error, which must not read as an answer."""
    listener = reach.ReachListener("127.0.0.1")
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, address: errno.EAGAIN)
    try:
        got = reach.probe({"up": listener.address}, budget_s=0, interval_s=0.05)
        assert got.reached == () and got.unreached == ("up",)
    finally:
        listener.close()


class ShortOfDescriptors:
    """A listening socket whose accept() first runs out of descriptors, then sees one probe give up,
    then hands over a connection, then is shut down."""

    def __init__(self):
        self.outcomes = [OSError(errno.EMFILE, "Too many open files"), OSError(errno.EMFILE, "Too many open files"),
                         OSError(errno.ECONNABORTED, "Software caused connection abort"), "conn",
                         OSError(errno.EINVAL, "Invalid argument")]
        self.closed_conns = 0

    def fileno(self) -> int:
        return 3

    def accept(self):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, OSError):
            raise outcome
        conn = type("Conn", (), {"close": lambda _: setattr(self, "closed_conns", self.closed_conns + 1)})()
        return conn, ("127.0.0.1", 1)


def test_the_listener_outlives_a_shortage_of_descriptors(caplog):
    """A loop that ended at the first EMFILE would leave the socket listening, its backlog filling
    with handshakes nobody accepts: from the backlog's end on, every probe of the host unanswered."""
    listener = ShortOfDescriptors()
    with caplog.at_level(logging.WARNING, logger="accelpact.control"):
        reach.accept_and_close(listener)  # returns only at EINVAL: shut down
    assert listener.outcomes == [] and listener.closed_conns == 1
    assert caplog.text.count("cannot accept") == 1  # said once, not at every retry


def test_a_returning_host_is_heard_within_a_round_of_its_return():
    host = MutedHost()
    try:
        host.unmute_after(0.3)
        got = reach.probe({"cut": host.address}, budget_s=5.0, interval_s=0.01)
        assert got.reached == ("cut",)
        assert 0.3 <= got.waited_s < 0.6  # a stalled connection would wait for its retransmission (up to 1 s)
    finally:
        host.close()


def test_the_listener_never_fills_its_backlog():
    listener = reach.ReachListener("127.0.0.1")
    try:
        for _ in range(2 * reach.LISTEN_BACKLOG):
            assert reach.probe({"up": listener.address}, budget_s=0, interval_s=0.5).reached == ("up",)
    finally:
        listener.close()
    assert reach.probe({"gone": listener.address}, budget_s=0, interval_s=0.5).reached == ("gone",)  # refused


def test_a_host_that_does_not_answer_at_attach_is_never_probed(caplog):
    up, muted = reach.ReachListener("127.0.0.1"), MutedHost()
    try:
        table = reach.LinkTable("10.9.9.9", {"up": up.address, "firewalled": muted.address})
        with caplog.at_level(logging.WARNING, logger="accelpact.control"):
            kept = reach.answering(table, budget_s=0.2)
        assert kept.targets == {"up": up.address} and kept.silent == {"firewalled"}
        assert "firewalled" in caplog.text and "will not probe" in caplog.text
    finally:
        up.close()
        muted.close()


def test_every_rank_publishes_its_listener_and_reads_the_others(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(reach, "listen_address", lambda group: "127.0.0.1")
    remote = reach.ReachListener("127.0.0.1")
    try:
        store.set("reach/1", f"127.0.0.2:{remote.address[1]}")  # rank 1, as if on another host
        monkeypatch.setattr(reach, "answering", lambda table: table)  # 127.0.0.2 is this host too
        import datetime

        listener, table = reach.publish(store, None, 0, 2, datetime.timedelta(seconds=5))
        try:
            assert store.get("reach/0").decode() == f"127.0.0.1:{listener.address[1]}"
            assert table.own == "127.0.0.1" and table.targets == {"127.0.0.2": ("127.0.0.2", remote.address[1])}
        finally:
            listener.close()
    finally:
        remote.close()


def test_a_rebuilt_plane_does_not_ask_a_host_found_silent_again(monkeypatch):
    """A membership change builds a new plane: asking the firewalled host again would hold the
    change up for the whole attach budget (1 s) every time."""
    import datetime

    asked = []

    def answering(table):
        asked.append(set(table.targets))
        return table

    store = dist.HashStore()
    store.set("reach/1", "127.0.0.2:9")
    store.set("reach/2", "127.0.0.3:9")
    monkeypatch.setattr(reach, "listen_address", lambda group: "127.0.0.1")
    monkeypatch.setattr(reach, "answering", answering)
    listener, table = reach.publish(store, None, 0, 3, datetime.timedelta(seconds=5), silent=frozenset({"127.0.0.3"}))
    listener.close()
    assert asked == [{"127.0.0.2"}]
    assert set(table.targets) == {"127.0.0.2"} and table.silent == {"127.0.0.3"}


def fake_runtime(probe, *, saw_timeout: float = 5.0):
    """What `checked_after_links` reads of a Runtime, with a check that records its timeout."""
    from types import SimpleNamespace

    seen = {}
    control = SimpleNamespace(links=reach.LinkTable("10.0.0.1", {"10.0.0.2": ("10.0.0.2", 1)}), timeout_s=saw_timeout,
                              probe_links=probe)

    @contextlib.contextmanager
    def timeout_for(t):
        seen["timeout"] = t
        yield

    control.timeout_for = timeout_for
    stragglers = SimpleNamespace(check=lambda flag, t: seen.setdefault("flag", flag))
    records = []
    rt = SimpleNamespace(control=control, config=Config(data_timeout_s=1.0, control_timeout_s=saw_timeout),
                         listeners=[], update_index=7, stragglers=stragglers, link_wait="stale",
                         trace=SimpleNamespace(write=records.append))
    return rt, seen, records


def test_the_check_goes_with_the_rest_of_the_control_timeout_and_the_wait_is_recorded():
    from accelpact.runtime.link_wait import checked_after_links

    rt, seen, records = fake_runtime(lambda budget, interval: reach.Probed(("10.0.0.2",), (), 0.5, 50))
    assert checked_after_links(rt, True, 0.0) == 1
    assert seen == {"timeout": pytest.approx(4.5), "flag": 1}
    assert rt.link_wait.waited_s == 0.5 and records[0]["kind"] == "link_wait" and records[0]["rounds"] == 50
    rt, seen, records = fake_runtime(lambda budget, interval: pytest.fail("a clean boundary probed"))
    assert checked_after_links(rt, False, 0.0) == 0 and rt.link_wait is None and records == []


def test_a_probe_that_cannot_open_a_socket_sends_the_check_at_once(caplog):
    from accelpact.runtime.link_wait import checked_after_links

    def no_sockets(budget, interval):
        raise OSError(24, "Too many open files")

    rt, seen, records = fake_runtime(no_sockets)
    with caplog.at_level(logging.WARNING, logger="accelpact.runtime"):
        assert checked_after_links(rt, True, 0.0) == 1
    assert records == [] and "Too many open files" in caplog.text
    assert seen["timeout"] == pytest.approx(5.0, abs=0.05)


def test_what_a_failed_probe_waited_comes_off_the_check_timeout():
    """A probe that failed after waiting must not hand the check the whole control timeout: this
    rank's deadline would move past its peers'."""
    import time

    from accelpact.runtime.link_wait import checked_after_links

    def fails_late(budget, interval):
        time.sleep(0.3)
        raise OSError(24, "Too many open files")

    rt, seen, _ = fake_runtime(fails_late)
    assert checked_after_links(rt, True, 0.0) == 1
    assert 4.5 < seen["timeout"] <= 4.7  # C - the 0.3 s already spent


def test_attach_goes_on_without_probing_when_the_first_probe_cannot_open_a_socket(monkeypatch, caplog):
    import datetime

    def no_sockets(table):
        raise OSError(24, "Too many open files")

    store = dist.HashStore()
    store.set("reach/1", "127.0.0.2:9")
    monkeypatch.setattr(reach, "listen_address", lambda group: "127.0.0.1")
    monkeypatch.setattr(reach, "answering", no_sockets)
    with caplog.at_level(logging.WARNING, logger="accelpact.control"):
        listener, table = reach.publish(store, None, 0, 2, datetime.timedelta(seconds=5))
    try:
        assert listener is not None and table.targets == {} and table.own == "127.0.0.1"
        assert "no link will be probed" in caplog.text and "Too many open files" in caplog.text
    finally:
        listener.close()


# ---------------------------------------------------------------------- runtime (4 gloo ranks) --

def link_waits(trace: Path) -> list[dict]:
    out = []
    for path in sorted(trace.glob("trace-rank*.jsonl")):
        out += [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "link_wait"]
    return out


def drill(tmp_path, **kw) -> tuple[list[dict], list[dict]]:
    d = Drill(trace_dir=str(tmp_path / "trace"), framework="fsdp2", updates=5, faults="skip@3:committed:2",
              data_timeout_s=1.0, **kw)
    results = run_world(run_drill, 4, d, timeout_s=150, pg_timeout_s=30)
    assert_valid_run(tmp_path / "trace")
    for r in results:
        assert r["rejected"] is None, r["rejected"]
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
        assert [h["action"] for h in r["history"]] == ["preserve"]
    return results, link_waits(tmp_path / "trace")


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_the_check_waits_for_a_returning_link_and_goes_when_it_answers(tmp_path):
    """Every rank is given a host that answers 0.6 s after its first probe: a rank that saw the
    failure sends its check then, with the rest of the control timeout, and the repair is bitwise."""
    results, waits = drill(tmp_path, control_timeout_s=6.0, mute_links=(3, 0.6))
    assert waits, "no rank waited for its links"
    for w in waits:
        assert w["update"] == 3 and w["reached"] == ["muted-host"] and w["unreached"] == []
        assert 0.6 <= w["waited_s"] < 1.5 and w["budget_s"] == pytest.approx(4.0)
        assert w["check_timeout_s"] == pytest.approx(6.0 - w["waited_s"])
    waited = {r["rank"]: r["history"][0]["link_wait_s"] for r in results}
    assert sorted(w["waited_s"] for w in waits) == sorted(v for v in waited.values() if v)  # the record has it
    for r in results:  # only a rank that saw the failure waits for its links
        if r["history"][0]["link_wait_s"]:
            assert r["history"][0]["saw_failure"], r["history"][0]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_link_that_never_answers_costs_the_budget_and_keeps_the_deadline(tmp_path):
    """C - 2D = 1 s: the check is sent after 1 s with a 2 s timeout (the deadline it had), and the
    recovery goes on (the real links are up)."""
    _, waits = drill(tmp_path, control_timeout_s=3.0, mute_links=(3, 60.0))
    assert waits
    for w in waits:
        assert w["reached"] == [] and w["unreached"] == ["muted-host"]
        assert 1.0 <= w["waited_s"] < 1.5 and w["check_timeout_s"] == pytest.approx(2.0)
