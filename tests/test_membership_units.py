"""Membership change pieces that need no world: the state transfer's packing and digest, the
small state's round trip, the spare pool's claims."""

import copy
import datetime

import pytest
import torch
import torch.distributed as dist

from accelpact.checkpoint.appstate import capture_rng_state
from accelpact.membership import keys, pool, small_state, transfer
from accelpact.runtime.snapshot import BoundarySnapshot


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
    small_state.apply(small_state.decode(raw), data_state=cursor2, stateful=(sched2,), optimizer=opt2)
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
    assert small_state.newest_frontier(store, 2) == 4 and rep.written >= 1 and not rep.error
    assert small_state.newest_frontier(store, 3) is None
    rep.stop()


def test_a_spare_is_claimed_once_and_released_with_the_jobs_code():
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    pool.register(store, 4)
    pool.register(store, 5)
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
                store.set(keys.heartbeat(p), str(n))
            time.sleep(0.02)

    worker = threading.Thread(target=beat, args=((0, 1, 2),), daemon=True)
    worker.start()
    try:
        assert not register.a_member_went_silent(store, 3, 0.05, stop_early=lambda: False)
        store.set(keys.heartbeat(3), "1")  # position 3 beat once, then its process was gone
        t = time.monotonic()
        assert register.a_member_went_silent(store, 4, 0.05, stop_early=lambda: False)
        assert time.monotonic() - t < 1.0
        assert register.a_member_went_silent(store, 3, 10.0, stop_early=lambda: True)  # a peer's presence
    finally:
        stop.set()
        worker.join()


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
    decision = register._decide(store, 0, 4, [0, 1], lambda position: 5)
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
