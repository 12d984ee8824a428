"""comm/connections.py: a rank that leaves a retired world closes its connections of it, and a
peer waiting on it inside a collective learns at once instead of at the group's timeout."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from accelpact.comm import connections, make_group
from accelpact.testing.spawn import run_world

PEER_TIMEOUT_S = 20.0  # what the peer would wait without the close


def _leave_and_wait(rank: int, world_size: int) -> dict:
    connections.track()
    retired = dist.new_group([0, 1], timeout=__import__("datetime").timedelta(seconds=PEER_TIMEOUT_S))
    kept = dist.new_group([0, 1, 2])
    labelled = make_group([0, 1, 2], label="probe", generation=0, timeout=20)  # AccelPact's own groups too
    out: dict = {"recorded": len(connections.connections_of(retired)) if rank < 2 else None,
                 "labelled": len(connections.connections_of(labelled))}
    t = torch.ones(64)
    if rank < 2:
        dist.all_reduce(t, group=retired)  # the group works before
    dist.barrier(group=kept)
    if rank == 0:
        time.sleep(0.3)  # the peer is waiting in its all-reduce by now
        severed = connections.sever([retired])
        out["closed"] = severed.closed
        try:
            dist.all_reduce(t, group=retired)
            out["own_later_op"] = "completed"
        except RuntimeError as exc:
            out["own_later_op"] = str(exc)
    elif rank == 1:
        t0 = time.monotonic()
        try:
            dist.all_reduce(t, group=retired)  # rank 0 never joins this one
            out["peer_error"] = None
        except RuntimeError as exc:
            out["peer_error"] = str(exc)
        out["peer_waited_s"] = time.monotonic() - t0
    kept_sum = torch.ones(1)
    dist.all_reduce(kept_sum, group=kept)  # the groups that were not severed still work
    out["kept_sum"] = float(kept_sum)
    out["untracked"] = connections.sever([dist.group.WORLD]).skipped
    out["cap"] = dict(connections.retransmit_cap)
    out["kept_rto_max"] = [] if out["cap"]["unsupported"] else _rto_max(connections.connections_of(kept))
    return out


def _rto_max(recorded) -> list[int]:
    import os
    import socket

    values = []
    for fd, _ in recorded:
        with socket.socket(fileno=os.dup(fd)) as sock:
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                values.append(sock.getsockopt(socket.IPPROTO_TCP, connections.TCP_RTO_MAX_MS))
    return values


@pytest.mark.timeout(120)
def test_closing_a_retired_groups_connections_fails_the_waiting_peer_at_once():
    r0, r1, r2 = run_world(_leave_and_wait, 3, timeout_s=90)
    assert r0["recorded"] >= 1 and r1["recorded"] >= 1  # gloo connected the pair at construction
    assert all(r["labelled"] >= 1 for r in (r0, r1, r2))
    assert sum(r0["closed"].values()) >= 1
    assert "closed by peer" in r1["peer_error"].lower() or "reset by peer" in r1["peer_error"].lower(), r1
    assert r1["peer_waited_s"] < PEER_TIMEOUT_S / 4, r1  # the close, not the timeout, ended the wait
    assert r0["own_later_op"] != "completed"  # the retired group stays unusable here too
    assert [r["kept_sum"] for r in (r0, r1, r2)] == [3.0, 3.0, 3.0]  # and no process was taken down
    # every connection of a recorded group has its retransmission back-off capped at 1 s (or the
    # kernel says why not: before Linux 6.15)
    for r in (r0, r1, r2):
        if r["cap"]["unsupported"]:
            assert "TCP_RTO_MAX_MS" in r["cap"]["unsupported"] and not r["cap"]["capped"]
        else:
            assert r["cap"]["capped"] >= 2 and r["kept_rto_max"] and set(r["kept_rto_max"]) == {1000}, r
    # the default group was built before tracking began: nothing is closed, and it says why
    assert all("before tracking" in why for why in r0["untracked"].values()) and r0["untracked"]


def test_a_descriptor_that_names_another_socket_now_is_left_alone(monkeypatch):
    """fd numbers are reused: a recorded (fd, inode) whose fd now names another socket is skipped."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    server.close()
    try:
        wrong = (a.fileno(), "socket:[1]")
        assert connections._shut(*wrong) is False
        a.send(b"x")
        assert b.recv(1) == b"x"  # still connected: nothing was shut
        # and a listening socket is never shut (gloo's event loop treats that as fatal)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        target = connections._sockets()[listener.fileno()]
        assert connections._shut(listener.fileno(), target) is False
        listener.close()
        right = (a.fileno(), connections._sockets()[a.fileno()])
        assert connections._shut(*right) is True
        assert b.recv(1) == b""  # the peer sees the close
    finally:
        a.close()
        b.close()


def test_a_connection_counts_as_intact_until_its_peer_closes_it(monkeypatch):
    """`intact` (a standby's check before it is reported): open and idle, or with data waiting,
    is intact (a peek consumes nothing); closed by the peer, or its descriptor gone, is not."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()

    class Group:
        group_name = "accelpact:probe:s0"

    group = Group()
    monkeypatch.setitem(connections._by_group, id(group), (group.group_name, (
        (a.fileno(), connections._sockets()[a.fileno()]), (server.fileno(), connections._sockets()[server.fileno()]))))
    try:
        assert connections.intact(group)  # the listener is not asked
        b.send(b"x")
        time.sleep(0.05)
        assert connections.intact(group) and a.recv(1) == b"x"  # pending data: not a close, and not consumed
        b.close()
        time.sleep(0.05)
        assert not connections.intact(group)
        a.close()
        assert not connections.intact(group)  # its descriptor no longer names the socket recorded
    finally:
        a.close()
        server.close()


def test_a_service_connection_opened_while_a_group_is_built_is_not_the_groups(monkeypatch):
    """Found by review, by reading: a group's connections are the sockets that appeared while it was
    built, and neighbour replication or link probing may open one on their threads meanwhile;
    severed with the group, it broke for nothing. Connections to or from a registered service port
    are left out; the group's own (here, a plain connection) are recorded."""
    import socket

    service = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port = service.getsockname()[1]
    connections.service_port(port)
    opened: list[socket.socket] = []

    class Group:
        group_name = "accelpact:test:service"

    def build():
        opened.append(socket.create_connection(service.getsockname()))  # the replicator's, say
        opened.append(socket.create_connection(other.getsockname()))  # the group's own
        return "built"

    group = Group()
    monkeypatch.setattr(connections, "ProcessGroup", Group)  # what `recorded` records for
    monkeypatch.setattr(connections, "_cap_retransmit", lambda fd, target: None)
    try:
        assert connections.recorded(build, "gloo", group_of=lambda built: group) == "built"
        _, recorded = connections._by_group.pop(id(group))
        fds = {fd for fd, _ in recorded}
        assert opened[1].fileno() in fds and opened[0].fileno() not in fds
    finally:
        for sock in (*opened, service, other):
            sock.close()
        connections._service_ports.discard(port)


def test_a_groups_connection_record_goes_with_the_group():
    """Found by review: one record per group ever built was kept for good (keyed by id, so a
    long job's recoveries grew the table); it now goes when the group is freed."""
    import gc

    from torch._C._distributed_c10d import HashStore, PrefixStore, ProcessGroup

    def built():
        pg = ProcessGroup(PrefixStore("x/", HashStore()), 0, 1)
        pg._set_group_name("accelpact:t:g0")
        pg._set_group_desc("accelpact:t:g0")
        return pg

    before = len(connections._by_group)
    pgs = [connections.recorded(built, "gloo") for _ in range(20)]
    assert len(connections._by_group) == before + 20
    del pgs
    gc.collect()
    assert len(connections._by_group) == before
