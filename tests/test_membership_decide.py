"""The membership decision is pure: who is lost, which spare takes over, which peer sends."""

from accelpact.membership.decide import MembershipDecision, Presence, decide_membership


def _hsdp(position, frontier=4, ok=True, why=""):
    replicas = (0, 2) if position in (0, 2) else (1, 3)  # 2x2 HSDP: same shard coordinate
    return Presence(position=position, frontier=frontier, generation=0, rerun_ok=ok, rerun_reason=why,
                    replicas=replicas)


def test_a_lost_rank_is_taken_over_by_a_spare_with_state_from_its_replica_peer():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(1), _hsdp(2)], free_spares=[4, 5],
                          small_state_at={3: {4}})
    assert d.replace and d.lost == (3,) and d.assign == {3: 4} and d.source == {3: 1} and d.holders == {3: (1,)}
    assert d.frontier == 4 and d.generation == 1 and d.fenced(3) and not d.fenced(0)
    assert MembershipDecision.from_json(d.to_json()) == d


def test_a_rank_named_lost_by_a_rejected_change_is_not_fenced():
    """No spare free: the change rejects. A lost rank that was only late must follow that reject
    (exit 75, restarted with the job), not end as a fenced one whose agent reports success."""
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(1), _hsdp(2)], free_spares=[],
                          small_state_at={3: {4}})
    assert not d.replace and not d.shrink and d.lost == (3,) and not d.fenced(3)


def test_two_lost_ranks_of_one_shard_are_served_round_robin_by_its_holders():
    reports = [Presence(p, 2, 0, True, "", (0, 1, 2, 3, 4, 5)) for p in (0, 1, 2, 3)]  # DDP: all replicas
    d = decide_membership(world=1, world_size=6, reports=reports, free_spares=[6, 7], small_state_at={4: {2}, 5: {2}})
    assert d.replace and d.assign == {4: 6, 5: 7} and d.source == {4: 0, 5: 1}


def test_every_reason_to_reject_is_named():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(2, frontier=5), _hsdp(1, ok=False, why="x")],
                          free_spares=[], small_state_at={3: {3}})
    assert not d.replace
    text = " ".join(d.reasons)
    for needle in ("different frontiers", "cannot re-run", "0 spare(s) free", "not replicated"):
        assert needle in text, (needle, d.reasons)


def test_a_shard_without_a_live_holder_cannot_be_replaced():
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(2)], free_spares=[4, 5],
                          small_state_at={1: {4}, 3: {4}})
    assert not d.replace and any("no live replica peer holds the shard of lost rank 1" in r for r in d.reasons)


def test_nobody_lost_rebuilds_the_world_around_the_same_members():
    """The control plane failed on a rank while every process lived (its check broke after its
    contribution left): every position reports, and the world is rebuilt at the agreed frontier
    with nobody to replace; the rank whose check failed rolls forward to its peers' commit. It
    used to reject ("every rank is present"), which spec/Membership.tla never required."""
    reports = [_hsdp(0, frontier=3), Presence(position=1, frontier=2, generation=0, rerun_ok=True, replicas=(1, 3),
                                              at_check=True), _hsdp(2, frontier=3), _hsdp(3, frontier=3)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[], small_state_at={})
    assert d.replace and d.lost == () and d.assign == {} and d.frontier == 3 and d.rolled == (1,)
    assert d.generation == 1 and not any(d.fenced(p) for p in range(4))
    behind = [_hsdp(0, frontier=3), _hsdp(1, frontier=2), _hsdp(2, frontier=3), _hsdp(3, frontier=3)]
    d = decide_membership(world=0, world_size=4, reports=behind, free_spares=[], small_state_at={})
    assert not d.replace and "did not contribute to the boundary check of update 3" in d.reasons[0]


def test_a_peer_that_rejected_while_the_change_waited_is_that_reject_not_a_loss():
    """A rank whose boundary check failed where its peers' passed left for a membership change;
    its peers, in their own recovery, met its departure and rejected. They are absent, but not
    lost: the decision is their reject, with its reason, whatever spares are free."""
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0)], free_spares=[4, 5, 6],
                          small_state_at={p: {4} for p in (1, 2, 3)}, peer_rejected="gather #5 failed: closed")
    assert not d.replace and not d.shrink and d.lost == () and not d.fenced(1)
    assert d.reasons == ("the job was rejected by a peer while this membership change waited for it (positions "
                         "[1, 2, 3] did not post presence): gather #5 failed: closed",)


def test_a_survivor_whose_envelope_does_not_qualify_replace_rejects_it_with_the_reason():
    unqualified = Presence(position=1, frontier=4, generation=0, rerun_ok=True, replicas=(1, 3), replace_ok=False,
                           replace_reason="not qualified for ddp on cpu-gloo at backward")
    d = decide_membership(world=0, world_size=4, reports=[_hsdp(0), unqualified, _hsdp(2)], free_spares=[4],
                          small_state_at={3: {4}})
    assert not d.replace and any("rank 1 cannot take part in a Replace: not qualified for ddp" in r
                                 for r in d.reasons)
    assert Presence.from_json(unqualified.to_json()) == unqualified


def test_the_decision_carries_the_survivors_recovery_count_for_the_spare():
    """Found by the spares campaign: a spare that joined counted its recoveries from 0, so at the
    next recovery it voted under epoch r1 while the survivors waited for r2, and every rank rejected
    ("no release vote from rank 1"). The decision now tells the spare where the count stands."""
    reports = [Presence(p, 4, 0, True, "", (0, 2) if p in (0, 2) else (1, 3), recoveries=3) for p in (0, 1, 2)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: {4}})
    assert d.replace and d.recoveries == 3
    assert MembershipDecision.from_json(d.to_json()).recoveries == 3
    assert Presence.from_json(reports[0].to_json()) == reports[0]


def _at_check(position, frontier=4):
    """A survivor whose boundary check of update frontier+1 failed after its clean contribution
    left; without a pre-step copy it could not go back to F (rerun_ok False), it goes on instead."""
    return Presence(position=position, frontier=frontier, generation=0, rerun_ok=False,
                    rerun_reason="its step of update 5 is applied and there is no pre-step copy",
                    replicas=(0, 2) if position in (0, 2) else (1, 3), at_check=True)


def test_a_member_lost_inside_the_boundary_check_rolls_the_survivors_that_missed_its_outcome_forward():
    """Ranks 0 and 2 committed update 5, rank 1's check failed when rank 3 died in it: the new
    world starts at F=5, rank 1 commits update 5 in the change, and the spare continues rank 3's
    stream from its state of 5 (written before its contribution left)."""
    reports = [_hsdp(0, frontier=5), _at_check(1), _hsdp(2, frontier=5)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: {4, 5}})
    assert d.replace and d.frontier == 5 and d.rolled == (1,) and d.source == {3: 1}, d.reasons
    assert MembershipDecision.from_json(d.to_json()) == d
    assert Presence.from_json(reports[1].to_json()) == reports[1]


def test_a_roll_forward_needs_the_lost_ranks_small_state_of_the_committed_update():
    reports = [_hsdp(0, frontier=5), _at_check(1), _hsdp(2, frontier=5)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: {4}})
    assert not d.replace and any("lost rank 3 was not replicated at F=5 (held: F=4)" in r for r in d.reasons)


def test_a_survivor_behind_that_did_not_reach_the_check_cannot_roll_forward():
    reports = [_hsdp(0, frontier=5), _hsdp(1), _hsdp(2, frontier=5)]
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: {4, 5}})
    assert not d.replace and d.rolled == ()
    assert any("rank(s) [1] at F=4 did not contribute to the boundary check of update 5" in r for r in d.reasons)
    far = decide_membership(world=0, world_size=4, reports=[_hsdp(0, frontier=6), _at_check(1), _hsdp(2)],
                            free_spares=[4], small_state_at={3: {4, 5}})
    assert not far.replace and any("different frontiers [4, 6]" in r for r in far.reasons)


def test_a_check_nobody_completed_keeps_the_frontier_although_the_lost_rank_wrote_the_next_state():
    """The lost rank wrote its state of 5 before its contribution left, and nobody committed 5:
    the new world re-runs update 5 from F=4, whose slot still holds the state of 4."""
    reports = [_hsdp(0), _at_check(1), _hsdp(2)]
    reports[1] = Presence(**{**reports[1].to_json(), "rerun_ok": True, "rerun_reason": ""})
    d = decide_membership(world=0, world_size=4, reports=reports, free_spares=[4], small_state_at={3: {4, 5}})
    assert d.replace and d.frontier == 4 and d.rolled == ()


def test_a_save_the_loss_interrupted_is_owed_by_the_new_world():
    """A survivor that met the loss in the checkpoint save of F says so; the decision owes that
    save to every member of the new world (the spare reads it from the register); a reject owes
    nothing."""
    cut = Presence(**{**_hsdp(0).to_json(), "save_interrupted": True})
    d = decide_membership(world=0, world_size=4, reports=[cut, _hsdp(1), _hsdp(2)], free_spares=[4],
                          small_state_at={3: {4}})
    assert d.replace and d.save_owed and MembershipDecision.from_json(d.to_json()).save_owed
    assert Presence.from_json(cut.to_json()).save_interrupted
    plain = decide_membership(world=0, world_size=4, reports=[_hsdp(0), _hsdp(1), _hsdp(2)], free_spares=[4],
                              small_state_at={3: {4}})
    assert not plain.save_owed
    everyone = decide_membership(world=0, world_size=4, reports=[cut, _hsdp(1), _hsdp(2), _hsdp(3)],
                                 free_spares=[4], small_state_at={})
    assert everyone.replace and everyone.lost == () and everyone.save_owed  # rebuilt around the same members
    no_spare = decide_membership(world=0, world_size=4, reports=[cut, _hsdp(1), _hsdp(2)], free_spares=[],
                                 small_state_at={3: {4}})
    assert not no_spare.replace and not no_spare.save_owed  # nobody goes on to take it
