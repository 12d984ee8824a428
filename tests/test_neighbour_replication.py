"""Neighbour-memory replication (#16): the ring, the holdings, the sockets, and the decision that
uses a copy only when it is complete, verifies and is of the agreed frontier."""

import datetime
import json
import socket
import struct
import time

import pytest
import torch
import torch.distributed as dist

from accelpact.config import Config
from accelpact.control.auth import Sealer
from accelpact.errors import ConfigError
from accelpact.membership import keys, transfer
from accelpact.membership.decide import Presence, decide_membership
from accelpact.membership.neighbour import HeldCopies, NeighbourCopy, holder_of, ring_stride, source_of
from accelpact.membership.replication import NeighbourReplicator

pytestmark = pytest.mark.timeout(60)


# -- the ring ---------------------------------------------------------------------------------
def test_the_stride_keeps_a_copy_off_its_rank_host_unless_told_otherwise():
    assert ring_stride(8, configured=0, local_world_size=4) == 4  # two hosts: the copy crosses
    assert ring_stride(4, configured=0, local_world_size=4) == 1  # one host: the next rank
    assert ring_stride(4, configured=0, local_world_size=None) == 1
    assert ring_stride(8, configured=3, local_world_size=4) == 3
    with pytest.raises(ValueError, match="onto itself"):
        ring_stride(4, configured=4, local_world_size=None)
    assert [holder_of(p, 4, 1) for p in range(4)] == [1, 2, 3, 0]
    assert all(source_of(holder_of(p, 8, 4), 8, 4) == p for p in range(8))


def test_config_names_a_bad_replicate_mode_or_stride():
    with pytest.raises(ConfigError, match="replicate must be one of off, neighbour"):
        Config(replicate="mirror")
    with pytest.raises(ConfigError, match="replicate_stride must be an integer >= 0"):
        Config(replicate_stride=-1)
    assert Config().with_env({"ACCELPACT_REPLICATE": "neighbour"}).replicate == "neighbour"


# -- the holdings -----------------------------------------------------------------------------
def _copy(source: int, frontier: int, payload: bytes = b"abc") -> NeighbourCopy:
    import hashlib

    return NeighbourCopy(source=source, frontier=frontier, digest=hashlib.sha256(payload).hexdigest(), layout={},
                         data=bytearray(payload))


def test_held_copies_keep_the_two_newest_complete_and_a_resend_voids_its_label():
    held = HeldCopies()
    assert held.complete(_copy(1, 3)) == [] and held.complete(_copy(1, 4)) == []
    gone = held.complete(_copy(1, 5))
    assert held.frontiers(1) == [4, 5] and [c.frontier for c in gone] == [3]  # its memory may be reused
    voided = held.begin(1, 5)  # update 5 was undone and runs again: its old copy must not outlive the resend
    assert held.frontiers(1) == [4] and [c.frontier for c in voided] == [5]
    assert held.get(1, 4) is not None and held.get(1, 5) is None


def test_audit_names_a_copy_whose_bytes_changed_in_memory():
    held = HeldCopies()
    held.complete(_copy(2, 7, b"state"))
    bad = _copy(3, 7, b"state")
    bad.data[0] ^= 1
    held.complete(bad)
    good, faults = held.audit()
    assert good == ((2, 7),)
    assert len(faults) == 1 and faults[0].startswith("the copy of rank 3 at F=7 no longer matches its digest")


# -- the decision -----------------------------------------------------------------------------
def _presence(position: int, *, frontier: int = 5, copies=(), faults=()) -> Presence:
    return Presence(position=position, frontier=frontier, generation=2, rerun_ok=True, copies=tuple(copies),
                    copy_faults=tuple(faults))


def _decide(reports, spares=(4,)):
    lost = [p for p in range(4) if p not in {r.position for r in reports}]
    return decide_membership(world=0, world_size=4, reports=reports, free_spares=spares,
                             small_state_at={p: {5} for p in lost})


def test_a_fully_sharded_loss_is_replaced_from_the_neighbour_copy_at_the_agreed_frontier():
    d = _decide([_presence(0, copies=[(3, 4), (3, 5)]), _presence(1), _presence(3, copies=[(2, 5)])])
    assert d.replace and d.lost == (2,) and d.source == {2: 3} and d.via == {2: "neighbour"}


def test_a_copy_of_another_frontier_is_never_used():
    """The lost rank died after committing F=5 but before its copy of 5 was complete: only F=4
    arrived. Using it would put the spare one update behind its peers."""
    d = _decide([_presence(0), _presence(1), _presence(3, copies=[(2, 4)])])
    assert not d.replace
    assert any("no survivor holds a complete neighbour copy of it at F=5 (copies held: rank 3 at F=4)" in r
               for r in d.reasons), d.reasons


def test_a_copy_that_does_not_verify_is_not_reported_and_the_reject_names_it():
    fault = "the copy of rank 2 at F=5 no longer matches its digest 0123456789ab"
    d = _decide([_presence(0), _presence(1), _presence(3, faults=[fault])])
    assert not d.replace and any(fault in r for r in d.reasons), d.reasons


def test_a_rank_and_the_holder_of_its_copy_lost_together_reject():
    d = _decide([_presence(0, copies=[(3, 5)]), _presence(1)], spares=(4, 5))
    assert not d.replace
    assert any("lost rank 2" in r and "none held" in r for r in d.reasons), d.reasons
    assert not any("lost rank 3" in r for r in d.reasons), d.reasons  # rank 3's copy is at rank 0


def test_a_replica_peer_is_preferred_to_a_neighbour_copy():
    reports = [Presence(position=p, frontier=5, generation=2, rerun_ok=True, replicas=(p % 2, p % 2 + 2),
                        copies=((2, 5),) if p == 3 else ()) for p in (0, 1, 3)]
    d = _decide(reports)
    assert d.replace and d.source == {2: 0} and d.via == {2: "replica"}


def test_the_decision_round_trips_through_the_register():
    d = _decide([_presence(0), _presence(1), _presence(3, copies=[(2, 5)])])
    from accelpact.membership.decide import MembershipDecision

    assert MembershipDecision.from_json(json.loads(json.dumps(d.to_json()))) == d
    p = _presence(3, copies=[(2, 5)], faults=["x"])
    assert Presence.from_json(json.loads(json.dumps(p.to_json()))) == p


# -- the sockets ------------------------------------------------------------------------------
@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    yield s
    del s


def _ring(store, sealers, *, world: int = 2, epoch=lambda: 0):
    return [NeighbourReplicator(store=store, position=p, world_size=world, stride=1, sends=True,
                                sealer=(lambda s=sealers[p]: s), world=lambda: 0, timeout_s=5.0,
                                store_host="127.0.0.1", epoch=epoch) for p in range(world)]


def _wait(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_copy_reaches_the_neighbour_with_the_bytes_read_before_the_step_changed_them(store):
    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret])
    try:
        w = torch.arange(1000, dtype=torch.float32)
        m = torch.ones(10, dtype=torch.float64)
        layout = {"tensors": [["w", [1000], "float32"], ["m", [10], "float64"]], "scalars": {}}
        ring[0].offer(7, [("w", w), ("m", m)], lambda: layout)
        ring[0].wait_packed()  # the optimizer pre-hook waits here; the step writes in place next
        w.add_(1.0)
        assert _wait(lambda: ring[1].held.get(0, 7) is not None), ring[0].stats()
        copy = ring[1].held.get(0, 7)
        assert copy.verifies() and copy.layout == layout
        expected = torch.cat([torch.arange(1000, dtype=torch.float32).view(torch.uint8),
                              torch.ones(10, dtype=torch.float64).view(torch.uint8)])
        assert bytes(copy.data) == expected.numpy().tobytes()
        assert _wait(lambda: ring[0].acked == 7) and ring[0].sent == 1
        first = ring[1].held.get(0, 7).data
        for f in (8, 9, 10):  # two held and one arriving: the fourth copy reuses the first one's memory
            ring[0].offer(f, [("w", w), ("m", m)], lambda: layout)
            assert _wait(lambda f=f: ring[0].acked == f)
        assert ring[1].held.frontiers(0) == [9, 10] and ring[1].held.get(0, 10).data is first
    finally:
        for r in ring:
            r.stop()


def test_a_rewind_drops_the_undone_updates_copy_and_a_frame_offered_before_a_recovery_is_refused(store):
    """Found by review: after a Rewind the undone update's copy kept its label until the re-run's
    frame began to arrive, so a loss in between handed the spare the undone update's state (it
    verifies against its own digest); and a frame still in flight across the recovery completed
    under that label again."""
    recoveries = [0]
    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret], epoch=lambda: recoveries[0])
    layout = {"tensors": [["w", [4], "float32"]], "scalars": {}}
    try:
        for f in (4, 5):
            ring[0].offer(f, [("w", torch.full((4,), float(f)))], lambda: layout)
            assert _wait(lambda f=f: ring[0].acked == f)
        recoveries[0] = 1  # the Rewind of update 5 (every rank counts it)
        ring[1].on_recovery_step(5, "restore")
        assert ring[1].held.frontiers(0) == [4]  # the copy of the undone update 5 is gone, F's stays
        ring[0].on_recovery_step(5, "restore")
        ring[0].offer(5, [("w", torch.zeros(4))], lambda: layout)  # the re-run's copy: accepted
        assert _wait(lambda: ring[0].sent == 3) and ring[1].held.get(0, 5).data == bytearray(16)
        # found by review: the socket's timeout bounds all of `sendall`, so a copy slower to stream
        # than the control timeout failed on every update; the bound grows with the bytes
        assert ring[0]._conn.gettimeout() == transfer.transfer_timeout_s(16, 5.0) > 5.0
        stale = 6
        ring[0]._epoch = lambda: 0  # a frame offered before recovery 1
        ring[0].offer(stale, [("w", torch.ones(4))], lambda: layout)
        assert _wait(lambda: ring[0].undone == 1), ring[0].stats()
        assert ring[1].held.frontiers(0) == [4, 5] and ring[0].refused == 0  # not an authentication refusal
    finally:
        for r in ring:
            r.stop()


def test_of_two_frames_of_one_label_the_later_one_stands_whichever_finishes_last():
    held = HeldCopies()
    later = NeighbourCopy(source=1, frontier=5, digest="b", layout={}, data=bytearray(b"b"), seq=7)
    earlier = NeighbourCopy(source=1, frontier=5, digest="a", layout={}, data=bytearray(b"a"), seq=6)
    held.complete(later)
    assert held.complete(earlier) == [earlier] and held.get(1, 5) is later
    assert held.drop_from(5) == [later] and held.frontiers(1) == []


def test_buffers_go_as_copies_taken_on_the_training_thread():
    """Found by review: buffers (BatchNorm's running stats) are written by the next forward, which
    the sender may still be packing through; parameters and optimizer state wait for the pack."""
    from types import SimpleNamespace

    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime import neighbours

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    offered = []
    rt = SimpleNamespace(model=model, optimizer=optimizer, update_index=3,
                         neighbours=SimpleNamespace(sends=True, offer=lambda f, moved, layout: offered.append(moved)),
                         _tracker=SimpleNamespace(phase=FailurePhase.OPTIMIZER))  # inside update 3's step
    neighbours.offer(rt)
    moved = dict(offered[0])
    assert moved["param:0.weight"].data_ptr() == model[0].weight.data_ptr()  # read before the next step
    assert moved["buffer:1.running_mean"].data_ptr() != model[1].running_mean.data_ptr()
    model(torch.randn(4, 2))  # the next forward updates the live buffer, not the offered copy
    assert torch.equal(moved["buffer:1.running_mean"], torch.zeros(2))


def test_a_copy_signed_with_another_secret_is_refused(store):
    ring = _ring(store, [Sealer(b"a" * 32, "job"), Sealer(b"b" * 32, "job")])
    try:
        ring[0].offer(3, [("w", torch.zeros(4))], lambda: {"tensors": [], "scalars": {}})
        assert _wait(lambda: ring[0].refused == 1), ring[0].stats()
        assert ring[1].held.sources() == [] and "refused" in ring[0].error
    finally:
        for r in ring:
            r.stop()


def test_a_copy_cut_off_midway_never_becomes_visible_and_the_last_complete_one_stays(store, caplog):
    """The frame is authentic and current (found by review: without its epoch the header was
    refused before any of its body was read, and nothing was cut)."""
    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret])
    try:
        ring[0].offer(4, [("w", torch.zeros(8))], lambda: {"tensors": [], "scalars": {}})
        assert _wait(lambda: ring[1].held.get(0, 4) is not None)
        where = json.loads(store.get(keys.neighbour_address(1)))
        header = {"source": 0, "frontier": 5, "nbytes": 1 << 20, "digest": "0" * 64, "layout": {},
                  "sender": "cut-sender", "seq": 1, "epoch": 0}  # fresh and authentic: only its body is cut
        from accelpact.membership.replication import _frame_mac

        header["mac"] = _frame_mac(secret, header)
        raw = json.dumps(header).encode()
        with caplog.at_level("INFO", logger="accelpact"):
            with socket.create_connection((where["host"], where["port"])) as conn:
                conn.sendall(b"APN1" + struct.pack(">I", len(raw)) + raw + b"x" * 1000)  # then the sender dies
            assert _wait(lambda: any("neighbour copy from a peer ended" in m for m in caplog.messages))
        assert not any("refused a neighbour copy" in m for m in caplog.messages)  # its body was being read
        assert ring[1].held.frontiers(0) == [4]
    finally:
        for r in ring:
            r.stop()


def test_a_copy_that_fails_to_pack_costs_that_copy_and_the_sender_goes_on(store):
    """Found by review: the sender caught only OSError, ValueError and KeyError; anything else (a
    store hiccup reading the holder's address, a layout that does not serialise) killed its
    thread, and every later optimizer step waited the timeout for a pack nobody made."""
    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret])
    try:
        def broken():
            raise TypeError("Object of type Tensor is not JSON serializable")

        ring[0].offer(3, [("w", torch.zeros(4))], broken)
        ring[0].wait_packed()
        assert _wait(lambda: "TypeError" in ring[0].error), ring[0].stats()
        layout = {"tensors": [["w", [4], "float32"]], "scalars": {}}
        ring[0].offer(4, [("w", torch.ones(4))], lambda: layout)
        t = time.perf_counter()
        ring[0].wait_packed()
        assert time.perf_counter() - t < 2.0  # the sender is alive: no timeout waited
        assert _wait(lambda: ring[1].held.get(0, 4) is not None)
    finally:
        for r in ring:
            r.stop()


def test_a_frame_that_fails_authentication_is_refused_before_its_body_is_read(store):
    """Found by review: a holder allocated and read the whole body before checking the header's
    MAC, so a header claiming a huge size killed its receive thread with a MemoryError. It is now
    refused at once, and a receive blocked in an accepted connection ends with stop()."""
    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret])
    try:
        where = json.loads(store.get(keys.neighbour_address(1)))
        header = {"source": 0, "frontier": 5, "nbytes": 1 << 50, "digest": "0" * 64, "layout": {}, "mac": "forged"}
        raw = json.dumps(header).encode()
        with socket.create_connection((where["host"], where["port"]), timeout=5) as conn:
            conn.sendall(b"APN1" + struct.pack(">I", len(raw)) + raw)
            assert conn.recv(1) == b"R" and conn.recv(1) == b""  # refused, and closed
        ring[0].offer(6, [("w", torch.zeros(4))], lambda: {"tensors": [["w", [4], "float32"]], "scalars": {}})
        assert _wait(lambda: ring[1].held.get(0, 6) is not None)  # the holder still receives
        idle = socket.create_connection((where["host"], where["port"]), timeout=5)
        time.sleep(0.1)
        ring[1].stop()
        assert idle.recv(1) == b""  # its accepted connection was closed
        idle.close()
    finally:
        for r in ring:
            r.stop()


def test_a_frame_sent_again_is_refused_and_an_older_senders_too(store):
    """Found by review: the frame's MAC had no freshness, so a frame captured on the network and
    sent again within one attach was taken (the copy of F from before a Rewind could replace the
    re-run's copy of F, or an old label void every newer copy). Each frame now carries its
    sender's incarnation and a number, under the MAC."""
    from accelpact.membership.replication import _frame_mac

    secret = Sealer(b"s" * 32, "job")
    ring = _ring(store, [secret, secret])
    where = json.loads(store.get(keys.neighbour_address(1)))

    def frame(frontier: int, sender: str, seq: int, fill: int) -> bytes:
        body = bytes([fill]) * 16
        header = {"source": 0, "frontier": frontier, "nbytes": len(body), "digest": "0" * 64,
                  "layout": {"tensors": [["w", [4], "float32"]], "scalars": {}}, "sender": sender, "seq": seq,
                  "epoch": 0}
        header["mac"] = _frame_mac(secret, header)
        raw = json.dumps(header).encode()
        return b"APN1" + struct.pack(">I", len(raw)) + raw + body

    def send(raw: bytes) -> bytes:
        with socket.create_connection((where["host"], where["port"]), timeout=5) as conn:
            conn.sendall(raw)
            return conn.recv(1)

    try:
        first = frame(5, "a", 1, 0xAA)
        assert send(first) == b"K" and send(frame(5, "a", 2, 0xBB)) == b"K"  # a Rewind's re-run: F=5 again
        assert bytes(ring[1].held.get(0, 5).data) == b"\xbb" * 16
        assert send(first) == b"R"  # the same frame again
        assert bytes(ring[1].held.get(0, 5).data) == b"\xbb" * 16
        assert send(frame(6, "b", 1, 0xCC)) == b"K"  # a new sender (a spare took rank 0 over)
        assert send(frame(7, "a", 3, 0xDD)) == b"R"  # the one it replaced, though numbered higher
        assert ring[1].held.frontiers(0)[-1] == 6
    finally:
        for r in ring:
            r.stop()


def test_replicate_without_spares_is_refused_by_name():
    from accelpact.runtime.attach import _with_spares

    with pytest.raises(ConfigError, match="replicate='neighbour' keeps copies for a spare"):
        _with_spares(Config(replicate="neighbour"), torch.nn.Linear(2, 2))


# -- real jobs: FSDP2 fully sharded over 4 ranks, each shard held once --------------------------
def _explain(job) -> str:
    return "\n".join(f"--- launch rank {r} exit {c}\n" + "\n".join(o.splitlines()[-12:])
                     for r, (c, o) in enumerate(zip(job.codes, job.output)))


@pytest.mark.timeout(200)
def test_a_fully_sharded_rank_killed_at_a_random_point_is_replaced_from_its_neighbour_copy_bitwise():
    """No replica holds a fully sharded rank's shard: without neighbour copies its loss rejects
    (the decision tests above). With them, the spare receives the lost shard from the copy in its
    ring successor's memory, verified against the digest the lost rank computed, and the job ends
    bitwise equal to an uninterrupted run on every position. The wrapper (FSDP2 fully_shard or
    FSDP1 FULL_SHARD), the rank and the point (forward, backward, optimizer step, committed
    boundary) are drawn at random; the seed is printed."""
    import os
    import random

    from accelpact.testing.spares import run_spare_job
    from model_checking.membership_trace import check_membership_traces, load_membership_traces

    seed = int(os.environ.get("ACCELPACT_TEST_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    lost, phase, update = rng.randrange(4), rng.choice(["forward", "backward", "optimizer", "committed"]), rng.choice([3, 4])
    framework = rng.choice(["fsdp2-full", "fsdp1-full"])
    faults = f"kill@{update}:{phase}:{lost}"
    job = run_spare_job(framework=framework, faults=faults, updates=5, spares=1, replicate="neighbour")
    why = f"seed {seed}, {framework}, {faults}\n{_explain(job)}"
    assert job.result is not None and job.result["bitwise_ok"] and job.result["all_in_memory"], why
    assert job.codes[lost] == -9 and [c for r, c in enumerate(job.codes) if r != lost] == [0] * 4, why
    replaced = [h for v in job.result["verdicts"] for h in v["history"] if h["action"] == "replace"]
    assert replaced, why
    record = replaced[0]["replacement"]
    holder = holder_of(lost, 4, 1)
    assert record["lost"] == [lost] and record["sources"] == {str(lost): holder}, why
    sent = [t for v in job.result["verdicts"] for h in v["history"] for t in h.get("replacement", {}).get("transfers", [])
            if "to_spare" in t]
    assert sent and all(t["via"] == "neighbour" and t["bytes"] > 0 for t in sent), why
    stats = [v.get("neighbours") for v in job.result["verdicts"] if v.get("neighbours")]
    assert stats and all(s["sends"] and s["sent"] >= 1 and not s["refused"] for s in stats), stats
    traces = load_membership_traces(job.trace_dir)
    assert check_membership_traces(traces, replicas=[[p] for p in range(4)],
                                   copies={p: holder_of(p, 4, 1) for p in range(4)}) == [], why


@pytest.mark.timeout(200)
def test_a_rank_and_the_holder_of_its_copy_lost_together_reject_cleanly_with_the_reason():
    """Ranks 1 and 2 die in one update: rank 2's copy survives at rank 3, but rank 1's copy was
    in rank 2's memory (the blast radius the ring's stride covers was exceeded). Two spares are
    free, so the only reason is the missing copy; every survivor and both spares end with 75."""
    from accelpact.testing.spares import run_spare_job

    job = run_spare_job(framework="fsdp2-full", faults="kill@3:forward:1,kill@3:forward:2", updates=5, spares=2,
                        replicate="neighbour")
    assert job.codes[1] == job.codes[2] == -9, _explain(job)
    assert [job.codes[r] for r in (0, 3, 4, 5)] == [75, 75, 75, 75], _explain(job)
    text = "\n".join(job.output)
    assert "no survivor holds a complete neighbour copy of it at F=2 (none held" in text, _explain(job)
    assert "shard of lost rank 2" not in text, _explain(job)  # its copy at rank 3 would have served


def test_a_recovery_never_waits_for_the_network_only_for_a_pack_under_way(store):
    """Found by review: the wait before a restore (and before a membership change's presence)
    waited for an offer the sender had not taken, which it takes only once the copy before it is
    sent: a holder that vanished held the survivor for up to the control timeout. A recovery
    drops such an offer instead; a step still waits for it (a copy per update)."""
    rep = NeighbourReplicator(store=store, position=0, world_size=2, stride=1, sends=True,
                              sealer=lambda: Sealer(b"s" * 32, "job"), world=lambda: 0, timeout_s=0.3,
                              store_host="127.0.0.1")
    try:
        untaken = (5, [("w", torch.zeros(4))], lambda: {"tensors": [], "scalars": {}}, 0)
        with rep._slot:  # as if the sender were still sending the copy before it (not notified)
            rep._next = untaken
        t = time.perf_counter()
        rep.on_recovery_step(5, "restore")
        assert time.perf_counter() - t < 0.2 and rep._next is None and rep.join_wait_s == 0.0
        with rep._slot:
            rep._next = untaken
        rep.wait_packed()  # the optimizer step's wait: for the copy, up to the timeout
        assert rep.join_wait_s >= 0.25 and rep._next is None
    finally:
        rep.stop()


def test_only_an_updates_own_step_offers_a_copy():
    """Found by review: the offer hook fired on every `optimizer.step()`; a checkpoint save of a
    stateless optimizer steps it between updates (DCP's `_init_optim_state`), and the re-offer of
    F evicted the holder's complete copy of F as soon as its header arrived."""
    from types import SimpleNamespace

    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime import neighbours

    model = torch.nn.Linear(2, 2)
    offered = []
    rt = SimpleNamespace(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), update_index=3,
                         neighbours=SimpleNamespace(sends=True, offer=lambda f, moved, layout: offered.append(f)),
                         _tracker=SimpleNamespace(phase=None))
    neighbours.offer(rt)  # between updates
    assert offered == []
    rt._tracker.phase = FailurePhase.OPTIMIZER  # inside update 3's step
    neighbours.offer(rt)
    assert offered == [3]
