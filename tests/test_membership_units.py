"""Membership change pieces that need no world: the state transfer's packing and digest, the
small state's round trip, the spare pool's claims."""

import contextlib
import copy
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from accelpact.checkpoint.appstate import capture_rng_state
from accelpact.membership import keys, pool, small_state, transfer
from accelpact.runtime.snapshot import BoundarySnapshot


@contextlib.contextmanager
def beating(store, *spares: int):
    """Spares that beat as a waiting spare does (every 0.05 s here): a spare is offered only once
    the decider saw its beat move (`pool.SpareWatch`), a registered one that never beats is not."""
    import threading

    from accelpact.membership import liveness

    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            for spare in spares:
                store.set(keys.spare_alive(spare), liveness.beat_value(n, pool.SPARE_WORLD))
            stop.wait(0.05)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _trained(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_a_spare_with_fresh_wrappers_receives_bitwise_the_senders_state():
    sender, sopt = _trained(0)
    torch.manual_seed(1)
    spare = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    spare_opt = torch.optim.Adam(spare.parameters(), lr=0.1)  # no state yet: torch creates it lazily
    buf, layout = transfer.pack(sender, sopt), transfer.manifest(sender, sopt)
    transfer.materialise(spare, spare_opt, layout)
    transfer.unpack(spare, spare_opt, buf.clone(), layout)
    assert transfer.digest(transfer.pack(spare, spare_opt)) == transfer.digest(buf)
    for a, b in zip(sender.state_dict().values(), spare.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(sender.parameters(), spare.parameters()):
        for key in sopt.state[p]:
            assert torch.equal(sopt.state[p][key], spare_opt.state[q][key]), key


def test_wrappers_that_differ_are_refused_by_name():
    sender, sopt = _trained(0)
    other = torch.nn.Sequential(torch.nn.Linear(4, 2))
    oopt = torch.optim.Adam(other.parameters())
    with pytest.raises(transfer.TransferError, match="differ from the sender's"):
        transfer.unpack(other, oopt, transfer.pack(sender, sopt), transfer.manifest(sender, sopt))


class _Cursor:
    def __init__(self):
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, d):
        self.i = d["i"]


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_small_state_round_trip_continues_the_lost_ranks_stream():
    from accelpact.runtime.module_buffers import buffer_slots

    model, opt = _trained(3)
    cursor = _Cursor()
    cursor.i = 7
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    torch.manual_seed(42)
    snap = BoundarySnapshot.capture(cursor, 9, model, optimizer=opt, stateful=(sched,))
    expected_draw = torch.rand(3)
    raw = small_state.encode(snap, 9)
    assert small_state.frontier_of(raw) == 9
    # another process: other RNG, cursor, scheduler, learning rate
    torch.manual_seed(0)
    cursor2 = _Cursor()
    model2, opt2 = _trained(4)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    state = small_state.decode(raw)
    with pytest.raises(ValueError, match="replicated 3 module buffers, this rank's model has 0"):
        small_state.apply(state, data_state=cursor2, stateful=(sched2,), optimizer=opt2)
    assert cursor2.i == 0  # refused before anything changed
    # the buffers are the lost rank's own (BatchNorm's statistics from its own batches), not those
    # the transfer brought from a replica peer (found by review: the spare kept the peer's)
    assert not torch.equal(model2[1].running_mean, model[1].running_mean)
    small_state.apply(state, data_state=cursor2, stateful=(sched2,), optimizer=opt2, buffers=buffer_slots(model2))
    for name, b in model.named_buffers():
        assert torch.equal(dict(model2.named_buffers())[name], b), name
    assert cursor2.i == 7 and sched2.state_dict() == sched.state_dict()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(torch.rand(3), expected_draw)
    assert capture_rng_state().keys() == snap.rng.keys()


def test_the_replicator_writes_the_newest_state_off_the_training_thread():
    store = dist.HashStore()
    rep = small_state.Replicator(store, 2)
    snap = BoundarySnapshot.capture(None, 0)
    for frontier in range(5):
        rep.offer(copy.copy(snap), frontier)
    rep.flush()
    assert 4 in small_state.frontiers_held(store, 0, 2) and rep.written >= 1 and not rep.error
    assert small_state.frontiers_held(store, 0, 3) == frozenset()
    rep.stop()


def test_two_slots_keep_the_state_of_f_while_that_of_f_plus_1_is_written():
    """A rank writes its state of F+1 before the check of F+1; if nobody commits F+1, a spare
    still needs F. A single latest-wins key would hand it F+1's state (and the stream would be
    one update ahead); a slot of another frontier is refused by name."""
    store = dist.HashStore()
    rep = small_state.Replicator(store, 1)
    rep.offer(BoundarySnapshot.capture(_Cursor(), 4), 4)
    rep.flush()
    later = _Cursor()
    later.i = 5
    rep.offer(BoundarySnapshot.capture(later, 5), 5)
    rep.flush()
    assert small_state.frontiers_held(store, 0, 1) == {4, 5}
    assert small_state.read(store, 0, 1, 4)["cursor"] == {"i": 0}
    assert small_state.read(store, 0, 1, 5)["cursor"] == {"i": 5}
    with pytest.raises(ValueError, match="of F=4, not F=6"):
        small_state.read(store, 0, 1, 6)
    with pytest.raises(ValueError, match="no small state of rank 0"):
        small_state.read(store, 0, 0, 4)
    rep.stop()


def test_the_boundary_captures_the_state_of_the_update_it_commits_and_joins_it_before_the_check():
    """The replicator as the runtime's first listener: the clean boundary of update 5 captures
    the state of 5 and `before_check` returns only once the store has it; the step entry of update
    6 writes nothing more (the state of 5 is there already), unless this position never wrote it."""
    from accelpact.fsm.phases import FailurePhase

    class _SlowStore(dist.HashStore):
        def set(self, key, value):
            time.sleep(0.05)
            super().set(key, value)

    store = _SlowStore()
    cursor = _Cursor()
    cursor.i = 5
    rep = small_state.Replicator(store, 3, capture=lambda: BoundarySnapshot.capture(cursor, 5))
    rep.on_phase(5, FailurePhase.COMMITTED)
    assert rep.captures == 1 and rep.pending()
    rep.before_check(5)
    assert not rep.pending() and small_state.read(store, 0, 3, 5)["cursor"] == {"i": 5}
    rep.offer_at_step_entry(BoundarySnapshot.capture(cursor, 5), 5)
    assert not rep.pending() and rep.written == 1
    # the script ran something between the boundary and the next `rt.step` (a scheduler stepped
    # after `rt.step`): the step entry's state is what the survivors would restore, so it is written
    # (found by review: the boundary's stood, and a spare started one scheduler step behind)
    cursor.i = 6
    rep.offer_at_step_entry(BoundarySnapshot.capture(cursor, 5), 5)
    assert rep.pending()  # the forward joins it: a loss in this update must find it in the store
    rep.on_phase(6, FailurePhase.FORWARD)
    assert not rep.pending() and rep.written == 2 and small_state.read(store, 0, 3, 5)["cursor"] == {"i": 6}
    rep.offer_at_step_entry(BoundarySnapshot.capture(cursor, 5), 5)  # unchanged: nothing more
    assert not rep.pending() and rep.written == 2
    cursor.i = 5
    rep.position = 1  # a shrink renumbered this rank: its new position has no state of 5 from it
    rep.offer_at_step_entry(BoundarySnapshot.capture(cursor, 5), 5)
    rep.on_phase(6, FailurePhase.FORWARD)
    assert rep.written == 3 and small_state.read(store, 0, 1, 5)["cursor"] == {"i": 5}
    rep.stop()


def test_a_fenced_process_writes_its_small_state_into_the_world_it_was_fenced_from():
    """Found by reading: the slots were keyed by position alone. A rank declared lost while alive
    (fenced only at its next store read) could overwrite its successor's slot of the same parity
    with its own state, which a later Replace of that position would then hand to the next spare.
    A slot is now its world's; a member's slots of the world it left go with its first write in
    the next (a spare reads only a lost position's slots, and a member that moved on was not lost)."""
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=2))
    mine, theirs = _Cursor(), _Cursor()
    mine.i, theirs.i = 7, 666
    fenced = small_state.Replicator(store, 2, world_of=lambda: 0)
    world = [0]
    survivor = small_state.Replicator(store, 1, world_of=lambda: world[0])
    survivor.offer_at_step_entry(BoundarySnapshot.capture(mine, 5), 5)
    assert survivor.flush() and small_state.frontiers_held(store, 0, 1) == {5}
    world[0] = 1  # a Replace: world 1 begins, this rank keeps position 1
    survivor.offer_at_step_entry(BoundarySnapshot.capture(mine, 5), 5)  # its state of F under world 1
    assert survivor.flush() and survivor.written == 2
    assert small_state.frontiers_held(store, 1, 1) == {5}
    assert small_state.frontiers_held(store, 0, 1) == frozenset()  # the slots of world 0 were deleted
    spare = small_state.Replicator(store, 2, world_of=lambda: 1)  # position 2's successor in world 1
    spare.offer_at_step_entry(BoundarySnapshot.capture(mine, 5), 5)
    assert spare.flush()
    fenced.offer(BoundarySnapshot.capture(theirs, 5), 5)  # the fenced holder of 2 wakes up and writes
    assert fenced.flush()
    assert small_state.read(store, 1, 2, 5)["cursor"] == {"i": 7}  # its successor's slot is intact
    assert small_state.read(store, 0, 2, 5)["cursor"] == {"i": 666}
    for rep in (fenced, survivor, spare):
        rep.stop()


def test_a_spare_is_claimed_once_and_released_with_the_jobs_code():
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    pool.register(store, 4)
    pool.register(store, 5)
    with beating(store, 4, 5):
        assert pool.free_spares(store) == [4, 5]
        first = pool.Activation(spare=4, world=1, position=3, world_size=4)
        assert pool.claim(store, first)
        assert not pool.claim(store, pool.Activation(spare=4, world=1, position=2, world_size=4))
        assert pool.free_spares(store) == [5]
    assert pool.wait_for_claim(store, 4) == first
    pool.position_done(store, 2)
    pool.position_done(store, 2)  # the last position's end releases the spares still waiting
    with pytest.raises(pool.SpareReleased) as released:
        pool.wait_for_claim(store, 5)
    assert released.value.code == 0 and store.check([keys.job_end()])


def test_a_member_whose_heartbeat_stops_is_seen_within_three_beats():
    import threading
    import time

    from accelpact.membership import register

    store = dist.HashStore()
    stop = threading.Event()

    def beat(positions):
        n = 0
        while not stop.is_set():
            n += 1
            for p in positions:
                store.set(keys.heartbeat(0, p), str(n))
            time.sleep(0.02)

    worker = threading.Thread(target=beat, args=((0, 1, 2),), daemon=True)
    worker.start()
    try:
        assert not register.a_member_went_silent(store, 0, 3, 0.05, stop_early=lambda: False)
        store.set(keys.heartbeat(0, 3), "1")  # position 3 beat once, then its process was gone
        t = time.monotonic()
        assert register.a_member_went_silent(store, 0, 4, 0.05, stop_early=lambda: False)
        assert time.monotonic() - t < 1.0
        assert register.a_member_went_silent(store, 0, 3, 10.0, stop_early=lambda: True)  # a peer's presence
    finally:
        stop.set()
        worker.join()


def test_a_fenced_process_still_beating_does_not_hide_its_successors_death():
    """Found by reading: heartbeats were keyed by position alone. A rank declared lost but alive
    (cut off; it learns it was fenced only at its next store read) kept beating under its old
    position, and the spare that took the position over could die unseen: its position's key
    still moved. A beat is now its world's; the fenced process's beats are of the world it left."""
    import threading

    from accelpact.membership import liveness, register

    store = dist.HashStore()
    fenced = register.Heartbeat(store, position=3, interval_s=0.02, world_of=lambda: 0)  # still in world 0
    world = [1]
    members = register.Heartbeat(store, position=0, interval_s=0.02, world_of=lambda: world[0])
    stop = threading.Event()

    def the_other_members_of_world_1():
        while not stop.is_set():
            for p in (1, 2):
                store.set(keys.heartbeat(1, p), liveness.beat_value(time.monotonic_ns(), 1))
            time.sleep(0.02)

    others = threading.Thread(target=the_other_members_of_world_1, daemon=True)
    others.start()
    try:
        store.set(keys.heartbeat(1, 3), "1")  # the spare beat once (no certificate), then died
        time.sleep(0.1)
        assert store.check([keys.heartbeat(0, 3)]) and store.check([keys.heartbeat(1, 0)])
        t = time.monotonic()
        assert register.a_member_went_silent(store, 1, 4, 0.05, stop_early=lambda: False)
        assert time.monotonic() - t < 1.0
        world[0] = 2  # a member's beats follow its world
        time.sleep(0.1)
        assert store.check([keys.heartbeat(2, 0)])
    finally:
        stop.set()
        fenced.stop()
        members.stop()
        others.join()


def test_the_heartbeat_beats_while_the_training_thread_waits_on_the_store():
    """A TCPStore client serves one call at a time: sharing the training thread's, the heartbeat
    stopped for as long as a vote or an outcome was waited for (2.8 s seen), longer than peers wait
    before they count a position gone."""
    import threading

    from accelpact.membership import register

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    shared = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    heartbeat = register.Heartbeat(shared, position=0, interval_s=0.02)
    def long_wait():
        with pytest.raises(dist.DistStoreError):  # "never" is never set: the wait times out
            shared.wait(["never"], datetime.timedelta(seconds=1.0))

    waiting = threading.Thread(target=long_wait, daemon=True)
    try:
        time.sleep(0.1)
        waiting.start()  # the training thread's long wait on its client
        time.sleep(0.05)
        seen = set()
        for _ in range(8):
            seen.add(server.get(keys.heartbeat(0, 0)))
            time.sleep(0.08)
        assert len(seen) >= 4, "the heartbeat stood still while another thread waited on the store"
    finally:
        heartbeat.stop()
        waiting.join()


def test_a_dead_holder_on_this_host_is_certified_at_once_and_only_from_its_own_worlds_beat():
    """Its heartbeat carries its process: a pid that is gone (or a zombie, or reused) is a loss
    now, not after 2.5 beats; a beat of another world, or of another host, certifies nothing."""
    import subprocess
    import time

    from accelpact.membership import liveness, register

    gone = subprocess.Popen(["true"])
    gone.wait()
    where = liveness.identity().rsplit("/", 2)[0]
    dead_beat = f"7|0|{where}/{gone.pid}/{liveness._start_time(os.getpid())}"
    assert liveness.is_dead(dead_beat, 0) is True
    assert liveness.is_dead(dead_beat, 1) is None  # an earlier world's beat (a shrink renumbers)
    assert liveness.is_dead(liveness.beat_value(3, 0), 0) is False  # this very process runs
    assert liveness.is_dead(dead_beat.replace(where, "another-host:pid:[1]"), 0) is None
    assert liveness.is_dead("12", 0) is None  # a beat without its process (older format)
    reused = f"7|0|{where}/{os.getpid()}/0"  # this pid, another start time: the pid was reused
    assert liveness.is_dead(reused, 0) is True

    store = dist.HashStore()
    for p in range(3):
        store.set(keys.heartbeat(0, p), liveness.beat_value(1, 0))
    store.set(keys.heartbeat(0, 3), dead_beat)
    t = time.monotonic()
    assert register.a_member_went_silent(store, 0, 4, 10.0, stop_early=lambda: False)  # 2.5 beats = 25 s
    assert time.monotonic() - t < 1.0
    # watching world 1, the same dead process's world-0 beat certifies nothing: only silence counts
    t = time.monotonic()
    assert register.a_member_went_silent(store, 1, 4, 0.2, stop_early=lambda: False)
    assert time.monotonic() - t >= 0.45  # 2.5 beats of 0.2 s


def test_the_decision_counts_a_silence_from_when_the_watch_saw_it_begin():
    """A survivor that watched a position go silent for 2.5 beats decides at once: its wait for
    the decision does not watch 2.5 more (measured in bench/rankloss.py: 1.26 s -> 0.01 s)."""
    import time

    from accelpact.membership import register
    from accelpact.membership.decide import Presence

    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    for position in range(4):
        store.set(keys.holder(position), str(position))
    store.set(keys.heartbeat(0, 3), "41")  # an old-format beat: no certificate, only its silence counts
    pool.register(store, 4)
    for position, replicas in ((0, (0, 2)), (1, (1, 3)), (2, (0, 2))):
        register.post_presence(store, 0, Presence(position=position, frontier=5, generation=0, rerun_ok=True,
                                                  replicas=replicas))
    seen = {3: (b"41", time.monotonic() - 2.0)}  # silent for 2 s already, at a 0.8 s heartbeat
    t = time.monotonic()
    with beating(store, 4):
        decision = register.await_decision(store, 0, 4, grace_s=30.0, heartbeat_s=0.8,
                                           small_state_at=lambda p: {5}, seen=seen)
    assert decision.replace and decision.lost == (3,)
    assert time.monotonic() - t < 0.5  # without `seen`: 2.5 * 0.8 = 2 s


def test_a_peer_that_rejects_ends_the_wait_for_the_decision_with_its_reject():
    """Found by CI: the peers of a rank that left for a membership change rejected in their own
    recovery and exited; the rank waited until their processes were gone, then declared all
    three lost ("3 rank(s) lost but 2 spare(s) free"). The job's end names the reject instead,
    and the wait stops at once (the peers still heartbeat here: only the grace would end it)."""
    from accelpact.membership import register
    from accelpact.membership.decide import Presence

    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    for position in range(4):
        store.set(keys.heartbeat(0, position), f"1|0|{position}")
    pool.register(store, 4)
    register.post_presence(store, 0, Presence(position=0, frontier=2, generation=0, rerun_ok=True, replicas=(0, 2)))
    pool.end_job(store, 75, "rank 1: gather #5 failed")
    t = time.monotonic()
    decision = register.await_decision(store, 0, 4, grace_s=30.0, heartbeat_s=0.5, small_state_at=lambda p: {2})
    assert time.monotonic() - t < 1.0
    assert decision.outcome == "reject" and decision.lost == ()
    assert decision.reasons[0].endswith("(positions [1, 2, 3] did not post presence): rank 1: gather #5 failed")
    assert register.read_decision(store, 0) == decision  # the one register: a late peer follows it


def test_the_exit_barrier_counts_a_lost_node_once_and_a_fenced_process_not_at_all():
    """One torchrun agent per node (GROUP_RANK = launch rank // 2): the decision that loses ranks
    2 and 3 records who held them, and their one agent is the only one that never arrives."""
    from accelpact.membership import register
    from accelpact.membership.decide import Presence

    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    for launch_rank in range(6):
        store.set(keys.agent_of(launch_rank), str(launch_rank // 2))
    for position in range(4):
        store.set(keys.holder(position), str(position))
    pool.register(store, 4)
    pool.register(store, 5)
    for position, replicas in ((0, (0, 2)), (1, (1, 3))):
        register.post_presence(store, 0, Presence(position=position, frontier=5, generation=0, rerun_ok=True,
                                                  replicas=replicas))
    with beating(store, 4, 5):
        decision = register._decide(store, 0, 4, [0, 1], lambda position: {5})
    assert decision.replace and decision.assign == {2: 4, 3: 5}
    assert pool.agents_lost(store) == 1  # two ranks, one node
    store.append(keys.fenced_holders(), "3,")  # had rank 3 only been cut off, its sibling still died
    assert pool.agents_lost(store) == 1
    store.append(keys.fenced_holders(), "2,")
    assert pool.agents_lost(store) == 0  # both alive and fenced: their agent arrives


def test_survivors_wait_for_a_live_peer_long_enough_to_fail_its_probes_and_the_control_check():
    """Found by the spares campaign: rank 3, late at the committed boundary when rank 1 was
    killed there, posted its presence 7.06 s after the first survivor; the former grace (control
    timeout 6 s + 1 s) had ended 60 ms before, so it was declared lost with rank 1 (its replica
    peer: no holder left) and the survivors rejected a loss one free spare could have taken over."""
    from accelpact.runtime.member_change import presence_grace_s

    late = 1.5 + 0.5  # a late rank: past the data timeout
    probes, control = 0.9 * 1.5, 6.0
    assert presence_grace_s(6.0, 1.5) > 7.06
    assert presence_grace_s(6.0, 1.5) >= late + probes + control


def test_a_waiting_spare_preloads_the_framework_and_the_modules_named_for_it():
    from accelpact.errors import ConfigError
    from accelpact.membership import warm

    modules = warm.modules_to_preload({warm.ENV_PRELOAD: " json.decoder, ,email.mime "})
    assert modules[:len(warm.FRAMEWORK_MODULES)] == warm.FRAMEWORK_MODULES
    assert modules[len(warm.FRAMEWORK_MODULES):] == ("json.decoder", "email.mime")
    with pytest.raises(ConfigError, match="ACCELPACT_SPARE_PRELOAD names.*not module names"):
        warm.modules_to_preload({warm.ENV_PRELOAD: "mypkg/model.py"})
    took = warm.preload(["json.decoder", "accelpact_no_such_module"])
    assert isinstance(took["json.decoder"], float)
    assert took["accelpact_no_such_module"].startswith("ModuleNotFoundError")  # said, not fatal
    thread = warm.warm_up_in_background(["email.mime.text"])
    thread.join(30)
    import sys

    assert "email.mime.text" in sys.modules and not thread.is_alive()


def test_a_forked_child_beats_with_its_own_identity_not_its_parents():
    """A parent that computed its identity, then forked: had the child inherited it, the parent's
    exit would get the living child certified dead."""
    from accelpact.membership import liveness

    parent = liveness.identity()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its identity and leaves at once
        os.write(write, liveness.identity().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != parent and child.rsplit("/", 2)[1] == str(pid)
    assert liveness.is_dead(f"1|0|{child}", 0) is True  # and once reaped it is certified gone


def test_a_fenced_process_is_never_counted_among_the_positions_that_finished():
    """With on_reject="raise" a fenced process may exit normally: its atexit hook must not count
    its position as done, since the spare that took it over will (twice, and the job ends for the
    waiting spares one finisher early)."""
    from types import SimpleNamespace

    from accelpact import launch
    from accelpact.errors import RankFenced
    from accelpact.runtime.member_change import fenced_out

    store = dist.HashStore()
    records = []
    m = launch.Membership.__new__(launch.Membership)
    m.store, m.launch_rank, m.finished, m.position, m.world_size = store, 7, False, 3, 4
    rt = SimpleNamespace(rank=3, trace=SimpleNamespace(write=records.append))
    exc = fenced_out(rt, m, failed_world=2)
    assert isinstance(exc, RankFenced) and m.finished
    assert records[0]["event"] == "fenced" and store.get(keys.fenced_holders()) == b"7,"
    previous = launch._membership
    launch._membership = m
    try:
        launch._position_done()  # what atexit runs
    finally:
        launch._membership = previous
    assert not store.check([keys.positions_done()])  # the hook did not count this position


def test_survivors_wait_for_the_spares_state_then_probe_with_the_data_plane_bound(monkeypatch):
    """A survivor that sent no state probed at once, while the spare still took in its shard: one
    data timeout there rejected every Replace of a shard past a few hundred MB. It waits for the
    spare's mark instead (as long as a spare may take to join), and its probes keep their bound,
    so a second failure inside the change is noticed as fast as before."""
    from types import SimpleNamespace

    from accelpact.runtime import member_change

    store = dist.HashStore()
    rt = SimpleNamespace(rank=0, config=SimpleNamespace(control_timeout_s=6.0))
    change = SimpleNamespace(reasons=[], decision=SimpleNamespace(assign={3: 4}))
    m = SimpleNamespace(store=store, world=2)
    store.set(keys.taken_in(2, 3), "ok")
    member_change.await_spares(rt, m, change)
    assert change.reasons == []
    monkeypatch.setattr(member_change, "join_timeout_s", lambda rt: 0.2)
    change.decision.assign = {2: 5}  # this spare never says it took in its state
    member_change.await_spares(rt, m, change)
    assert len(change.reasons) == 1 and "the spares taking over [2] did not take in their state" in change.reasons[0]

    waited = []
    monkeypatch.setattr(member_change, "validate_groups", lambda groups, timeout: waited.append(timeout))
    monkeypatch.setattr(member_change.register, "post_vote", lambda *a: None)
    monkeypatch.setattr(member_change.register, "release", lambda *a: ("reject", ["test"]))
    rt.trace = SimpleNamespace(write=list)
    rt.data_plane = SimpleNamespace(groups={"shard": object()}, gids={"shard": SimpleNamespace(ranks=(0, 1))},
                                    probe_timeout=lambda: 2.0)
    change = SimpleNamespace(reasons=[], decision=SimpleNamespace(generation=1), outcome=None)
    member_change.validate_and_release(rt, SimpleNamespace(store=None, world=1, world_size=2), None, change,
                                       SimpleNamespace(lap=lambda name: None))
    assert waited == [2.0]


def test_a_spare_that_cannot_take_in_the_state_votes_against_with_the_cause(monkeypatch):
    """Raised out of attach instead, the spare exited 1 (not 75), posted no vote, and the survivors
    waited out their probes and the release for it before they rejected."""
    from types import SimpleNamespace

    from accelpact.membership.decide import MembershipDecision
    from accelpact.membership.pool import Activation
    from accelpact.runtime import member_change

    decision = MembershipDecision(outcome="replace", assign={3: 4}, source={3: 1}, holders={3: (1,)}, frontier=4,
                                  lost=(3,), world=0)

    def refused(*a, **kw):
        raise member_change.transfer.TransferError("state of rank 3 from rank 1 does not verify")

    voted = []
    monkeypatch.setattr(member_change.register, "read_decision", lambda store, world: decision)
    monkeypatch.setattr(member_change.transfer, "receive", refused)
    monkeypatch.setattr(member_change, "validate_and_release",
                        lambda rt, m, control, change, clock: voted.append(list(change.reasons)))
    rt = SimpleNamespace(rank=3, config=SimpleNamespace(control_timeout_s=6.0), trace=SimpleNamespace(write=list),
                         control=SimpleNamespace(group=None), model=None, optimizer=None)
    m = SimpleNamespace(store=dist.HashStore(), world=1, world_size=4)
    member_change.join(rt, m, Activation(spare=4, position=3, world=1, world_size=4))
    assert voted == [["spare 4 taking over rank 3: TransferError: state of rank 3 from rank 1 does not verify"]]
    assert m.store.get(keys.taken_in(1, 3)) == b"failed"  # the survivors stop waiting for it at once


def _init_world_bounds(rank: int, world_size: int) -> dict:
    from accelpact.comm import _c10d
    from accelpact.membership import world

    store, long = dist.HashStore(), datetime.timedelta(minutes=30)
    world.init_world(store, 1, position=0, world_size=1, backend="gloo", timeout=long,
                     connect_timeout=datetime.timedelta(seconds=5))
    kept = _c10d.group_timeout(dist.distributed_c10d._get_default_group())
    t = time.monotonic()
    try:  # position 1 never comes (a claimed spare that died)
        world.init_world(store, 2, position=0, world_size=2, backend="gloo", timeout=long,
                         connect_timeout=datetime.timedelta(seconds=1))
        failed = None
    except RuntimeError as exc:  # DistStoreError / gloo's connect timeout
        failed = type(exc).__name__
    return {"kept": kept.total_seconds(), "failed": failed, "waited": time.monotonic() - t}


@pytest.mark.timeout(90)
def test_a_new_world_waits_for_its_members_the_connect_timeout_not_the_jobs():
    """A survivor must not wait the job's 30 minutes for a claimed spare that died before it
    connected; once connected the world keeps the job's timeout."""
    from accelpact.testing.spawn import run_world

    (out,) = run_world(_init_world_bounds, 1, timeout_s=60)
    assert out["kept"] == 1800 and out["failed"] is not None and out["waited"] < 20, out


def test_a_membership_change_keeps_what_the_checkpointer_counted(monkeypatch):
    """The failed saves in a row are bounded by checkpoint_failures_tolerated across a change too."""
    from types import SimpleNamespace

    from accelpact.runtime import checkpointing, member_change

    class Fresh:
        def __init__(self, rt):
            self.saves, self.failed, self.in_a_row, self.restored = [], [], 0, None

    monkeypatch.setattr(checkpointing, "Checkpointer", Fresh)
    old = SimpleNamespace(saves=[{"step": 4}], failed=[{"step": 6}], in_a_row=1, restored="step 2")
    rt = SimpleNamespace(checkpointer=old)
    member_change.rebuild_checkpointer(rt)
    assert isinstance(rt.checkpointer, Fresh)
    assert (rt.checkpointer.saves, rt.checkpointer.failed, rt.checkpointer.in_a_row, rt.checkpointer.restored) == \
        ([{"step": 4}], [{"step": 6}], 1, "step 2")


def test_a_member_that_will_vote_against_still_probes_the_rebuilt_groups(monkeypatch):
    """Its peers' probes would otherwise wait the whole join timeout for it before they could vote."""
    from types import SimpleNamespace

    from accelpact.runtime import member_change

    probed, votes = [], []
    monkeypatch.setattr(member_change, "validate_groups", lambda groups, timeout: probed.append(len(groups)))
    monkeypatch.setattr(member_change.register, "post_vote", lambda store, world, rank, ok, why: votes.append((ok, why)))
    monkeypatch.setattr(member_change.register, "release", lambda *a: ("reject", ["rank 0: restore failed"]))
    rt = SimpleNamespace(rank=0, config=SimpleNamespace(control_timeout_s=6.0), trace=SimpleNamespace(write=list),
                         data_plane=SimpleNamespace(groups={"shard": object()}, gids={"shard": SimpleNamespace(ranks=(0, 1))},
                                                    probe_timeout=lambda: 2.0))
    change = SimpleNamespace(reasons=["rank 0: restore failed"], decision=SimpleNamespace(generation=1), outcome=None)
    member_change.validate_and_release(rt, SimpleNamespace(store=None, world=1, world_size=2), None, change,
                                       SimpleNamespace(lap=lambda name: None))
    assert probed == [1] and votes == [(False, "rank 0: restore failed")]


def test_a_ddp_whose_constructor_cannot_be_told_is_not_offered_a_replace(monkeypatch):
    """Found by review: torch 2.13's `forward_sync_buffers=False` still syncs buffers at
    construction while `broadcast_buffers=False` does not, and the object keeps only the former:
    the survivors mirrored the wrong collective for a spare, and the Replace timed out."""
    from types import SimpleNamespace

    from accelpact.membership import mirror

    bn = torch.nn.BatchNorm1d(4)
    plain = torch.nn.Linear(4, 4)
    cases = [(SimpleNamespace(forward_sync_buffers=True, module=bn), ""),
             (SimpleNamespace(forward_sync_buffers=False, module=plain), ""),  # no buffers: nothing to sync
             (SimpleNamespace(forward_sync_buffers=False, module=bn), "cannot be mirrored")]
    for ddp, expected in cases:
        monkeypatch.setattr(mirror, "ddp_modules", lambda model, ddp=ddp: [ddp])
        why = mirror.unmirrorable(torch.nn.Module())
        assert (expected in why) if expected else why == "", (ddp, why)


def test_a_spare_whose_join_is_rejected_leaves_the_evidence_and_the_fail_stop_record(monkeypatch, tmp_path):
    """The spare rejects as its peers do (`Runtime._reject`): its record, the reject evidence file and
    the attempt log's fail-stop record, which a spare on rank 0's position alone writes (before, it
    went to `fail_stop` bare: no evidence, and its peers waited for a record never written)."""
    import json
    import types
    from types import SimpleNamespace

    from accelpact.errors import RecoveryRejected
    from accelpact.membership.decide import MembershipDecision
    from accelpact.runtime import member_change
    from accelpact.runtime.attach import _join
    from accelpact.runtime.runtime import Runtime

    decision = MembershipDecision(outcome="replace", assign={0: 4}, source={0: 2}, holders={0: (2,)}, frontier=4,
                                  lost=(0,), world=1)
    reasons = ["rank 2: the spares taking over [0] did not take in their state"]
    monkeypatch.setattr(member_change, "join", lambda rt, m, activation: member_change.MemberChange(
        world=1, decision=decision, outcome="reject", reasons=list(reasons), timings_s={"transfer": 0.5}))
    recorded, rejected_seen, trace = [], [], []
    rt = SimpleNamespace(
        rank=0, attempt=0, _recoveries=3, update_index=0, frontier=0, generation=5, opt_step=0, history=[],  # no state taken in
        config=SimpleNamespace(trace_dir=str(tmp_path), on_reject="raise", boundary="aligned"),
        membership=SimpleNamespace(activation=pool.Activation(spare=4, position=0, world=2, world_size=4),
                                   store=dist.HashStore()),
        trace=SimpleNamespace(write=trace.append), observers=SimpleNamespace(rejected=rejected_seen.append),
        checkpointer=SimpleNamespace(record_fail_stop=lambda frontier, why: recorded.append((frontier, why))),
        prepare=lambda: None)
    rt._reject = types.MethodType(Runtime._reject, rt)
    rt._fail_stop_on_reject = types.MethodType(Runtime._fail_stop_on_reject, rt)

    with pytest.raises(RecoveryRejected) as raised:
        _join(rt, None)
    assert raised.value.reasons == tuple(reasons)
    assert recorded == [(4, reasons)]  # the attempt log's fail-stop record (rank 0 writes it), at the job's F
    [record] = rt.history
    assert (str(record.action), record.index, record.replacement["lost"], record.frontier) == ("reject", 3, [0], 4)
    assert [t["kind"] for t in trace] == ["recovery"] and trace[0]["reasons"] == reasons
    evidence = json.loads(open(raised.value.evidence_path).read())
    assert raised.value.evidence_path == str(tmp_path / "reject-rank0-attempt0.json")
    assert evidence["reasons"] == reasons and evidence["incident"]["cause_kind"] == "peer"
    assert len(rejected_seen) == 1  # the observers (metrics, incident export) saw the reject
    assert json.loads(rt.membership.store.get(keys.job_end()))["code"] == 75  # waiting spares end too


def test_a_survivor_aborts_the_retired_worlds_nccl_groups_before_anything_touches_the_device(monkeypatch):
    """`settle_retired_device`: every NCCL data-plane group aborted together, then this rank's device
    drained, each bounded; one that does not drain is the rank's vote against the change (c10d's
    destroy would shut the communicators down gracefully behind a kernel stuck on the lost peer)."""
    from types import SimpleNamespace

    from accelpact.errors import DeviceWorkFailed
    from accelpact.runtime import member_change

    log = []
    monkeypatch.setattr(member_change, "retire_groups", lambda groups, abort: log.append(("abort", sorted(groups),
                                                                                           abort)))
    monkeypatch.setattr(member_change, "this_device_sync", lambda groups: lambda: log.append(("drain",)))
    groups = {"replicate": "pg-r", "shard": "pg-s"}
    rt = SimpleNamespace(data_plane=SimpleNamespace(nccl_groups=lambda: groups, timeout_s=0.5))
    member_change.settle_retired_device(rt)
    assert log == [("abort", ["pg-r", "pg-s"], True), ("drain",)]

    log.clear()
    monkeypatch.setattr(member_change, "this_device_sync", lambda groups: lambda: time.sleep(5))  # a device that stays busy
    with pytest.raises(DeviceWorkFailed, match="the retired world's device did not settle: device work still running"):
        member_change.settle_retired_device(rt)

    log.clear()
    gloo = SimpleNamespace(data_plane=SimpleNamespace(nccl_groups=lambda: {}, timeout_s=0.5))
    member_change.settle_retired_device(gloo)  # gloo: the connections were severed; nothing to abort
    assert log == []
