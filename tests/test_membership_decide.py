"""The membership decision is pure: who is lost, which spare takes over, which peer sends."""

from accelpact.membership.decide import MembershipDecision, Presence, decide_membership


def _hsdp(position, frontier=4, ok=True, why=""):
    replicas = (0, 2) if position in (0, 2) else (1, 3)  # 2x2 HSDP: same shard coordinate
    return Presence(position=position, frontier=frontier, generation=0, rerun_ok=ok, rerun_reason=why,
                    replicas=replicas)


def test_a_lost_rank_is_taken_over_by_a_spare_with_state_from_its_replica_peer():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(1), _hsdp(2)], free_spares=[4, 5],
                          small_state_at={3: 4})
    assert d.replace and d.lost == (3,) and d.assign == {3: 4} and d.source == {3: 1} and d.holders == {3: (1,)}
    assert d.frontier == 4 and d.generation == 1 and d.fenced(3) and not d.fenced(0)
    assert MembershipDecision.from_json(d.to_json()) == d


def test_two_lost_ranks_of_one_shard_are_served_round_robin_by_its_holders():
    reports = [Presence(p, 2, 0, True, "", (0, 1, 2, 3, 4, 5)) for p in (0, 1, 2, 3)]  # DDP: all replicas
    d = decide_membership(world=1, world_size=6, reports=reports, free_spares=[6, 7], small_state_at={4: 2, 5: 2})
    assert d.replace and d.assign == {4: 6, 5: 7} and d.source == {4: 0, 5: 1}


def test_every_reason_to_reject_is_named():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(2, frontier=5), _hsdp(1, ok=False, why="x")],
                          free_spares=[], small_state_at={3: 3})
    assert not d.replace
    text = " ".join(d.reasons)
    for needle in ("different frontiers", "cannot re-run", "0 spare(s) free", "not replicated"):
        assert needle in text, (needle, d.reasons)


def test_a_shard_without_a_live_holder_cannot_be_replaced():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(2)], free_spares=[4, 5],
                          small_state_at={1: 4, 3: 4})
    assert not d.replace and any("no live replica peer holds the shard of lost rank 1" in r for r in d.reasons)


def test_nobody_lost_is_no_membership_change():
    d = decide_membership(world=0, world_size=2, reports=[_hsdp(0), _hsdp(1)], free_spares=[2], small_state_at={})
    assert not d.replace and "every rank is present" in d.reasons[0]


def test_a_survivor_whose_envelope_does_not_qualify_replace_rejects_it_with_the_reason():
    unqualified = Presence(position=1, frontier=4, generation=0, rerun_ok=True, replicas=(1, 3), replace_ok=False,
                           replace_reason="not qualified for ddp on cpu-gloo at backward")
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), unqualified, _hsdp(2)], free_spares=[4],
                          small_state_at={3: 4})
    assert not d.replace and any("rank 1 cannot take part in a Replace: not qualified for ddp" in r
                                 for r in d.reasons)
    assert Presence.from_json(unqualified.to_json()) == unqualified


def test_the_decision_carries_the_survivors_recovery_count_for_the_spare():
    """Found by the spares campaign: a spare that joined counted its recoveries from 0, so at the
    next recovery it voted under epoch r1 while the survivors waited for r2, and every rank rejected
    ("no release vote from rank 1"). The decision now tells the spare where the count stands."""
    reports = [Presence(p, 4, 0, True, "", (0, 2) if p in (0, 2) else (1, 3), recoveries=3) for p in (0, 1, 2)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: 4})
    assert d.replace and d.recoveries == 3
    assert MembershipDecision.from_json(d.to_json()).recoveries == 3
    assert Presence.from_json(reports[0].to_json()) == reports[0]
