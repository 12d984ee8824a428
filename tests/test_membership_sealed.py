"""The job store's membership values, sealed under ACCELPACT_SECRET (`membership.sealed`): what a
client that can write the store but lacks the secret can no longer make a membership change do."""

from __future__ import annotations

import json
import pickle

import pytest
import torch.distributed as dist

from accelpact.control.auth import ForgedValue
from accelpact.errors import SpareReleased
from accelpact.membership import keys, liveness, pool, register
from accelpact.membership.decide import MembershipDecision
from accelpact.membership.sealed import SealedStore, membership_store, unsealed

SECRET = {"ACCELPACT_SECRET": "job-secret"}


def sealed(namespace: str = "run/attempt0") -> SealedStore:
    store = membership_store(dist.HashStore(), SECRET, namespace)
    assert isinstance(store, SealedStore)
    return store


def test_without_a_secret_the_store_is_the_plain_one():
    plain = dist.HashStore()
    assert membership_store(plain, {}, "run/attempt0") is plain and unsealed(plain) is plain


def test_values_round_trip_as_bytes_and_carry_their_mac_in_the_raw_store():
    store = sealed()
    binary = (7).to_bytes(8, "little") + pickle.dumps({"rng": bytes(range(256))})  # a small state's shape
    store.set("membership/world0/small/1/1", binary)
    store.set("membership/world0/vote/1", json.dumps({"ok": True, "reason": ""}))
    assert store.get("membership/world0/small/1/1") == binary
    assert json.loads(store.get("membership/world0/vote/1")) == {"ok": True, "reason": ""}
    raw = store.raw.get("membership/world0/vote/1")
    assert len(raw) == 65 + len(json.dumps({"ok": True, "reason": ""})) and raw[64:65] == b":"
    assert store.clone().get("membership/world0/vote/1") == store.get("membership/world0/vote/1")


def test_a_value_forged_copied_or_sealed_elsewhere_is_refused():
    store = sealed()
    store.set("membership/world0/vote/1", json.dumps({"ok": False, "reason": "rank 1: broken"}))
    genuine = store.raw.get("membership/world0/vote/1")
    cases = {
        "unsigned": json.dumps({"ok": True, "reason": ""}),
        "guessed mac": "0" * 64 + ":" + json.dumps({"ok": True, "reason": ""}),
        "tampered": genuine.replace(b"false", b"true "),
    }
    for why, value in cases.items():
        store.raw.set("membership/world0/vote/1", value)
        with pytest.raises(ForgedValue, match="fails authentication"):
            store.get("membership/world0/vote/1")
        assert why
    store.raw.set("membership/world1/vote/1", genuine)  # replayed into the next world's change
    with pytest.raises(ForgedValue):
        store.get("membership/world1/vote/1")
    other = sealed("run/attempt1")  # the same secret, a restarted attempt
    other.raw.set("membership/world0/vote/1", genuine)
    with pytest.raises(ForgedValue):
        other.get("membership/world0/vote/1")
    stranger = SealedStore(store.raw, membership_store(dist.HashStore(), {"ACCELPACT_SECRET": "other"}, "run/attempt0")
                           .sealer)
    store.raw.set("membership/world0/vote/1", genuine)
    with pytest.raises(ForgedValue, match="another ACCELPACT_SECRET"):
        stranger.get("membership/world0/vote/1")


def test_create_once_registers_keep_the_first_value_and_open_it():
    store = sealed()
    assert store.compare_set("membership/world0/release", "", "resume") == b"resume"
    assert store.compare_set("membership/world0/release", "", "reject") == b"resume"  # the first stays
    store.raw.delete_key("membership/world0/release")
    store.raw.set("membership/world0/release", "resume")  # an attacker's value won the race
    with pytest.raises(ForgedValue):
        store.compare_set("membership/world0/release", "", "reject")
    with pytest.raises(ValueError, match="create-once"):
        store.compare_set("membership/world0/release", "resume", "reject")


def test_a_forged_decision_or_vote_is_evidence_not_an_order():
    store = sealed()
    decision = {"world": 0, "outcome": "replace"}
    store.raw.set(keys.decision(0), json.dumps(decision))
    with pytest.raises(ForgedValue):
        register.read_decision(store, 0)
    for position in range(2):  # every vote "ok", forged: the release refuses to resume on them
        store.raw.set(keys.vote(0, position), json.dumps({"ok": True, "reason": ""}))
    with pytest.raises(ForgedValue):
        register.release(store, 0, 2, timeout_s=0.5)
    assert not store.raw.check([keys.release(0)])  # nothing was released
    assert MembershipDecision  # the type the genuine path returns (tests/test_membership_units.py)


def test_a_forged_claim_never_puts_a_spare_in_the_job():
    store = sealed()
    pool.register(store, 5)
    activation = pool.Activation(spare=5, world=1, position=3, world_size=4)
    store.raw.set(keys.spare_claim(5), activation.to_json())  # unsigned: as a client without the secret writes it
    assert pool.unclaimed(store) == [5]  # a forged claim is no claim: the spare is still offered
    with pytest.raises(ForgedValue):  # and the decider, whose genuine claim it blocks, rejects on it
        pool.claim(store, activation)
    pool.end_job(store, 75, "the change rejected")
    with pytest.raises(SpareReleased):  # the spare never joined: it waited on, until the job ended
        pool.wait_for_claim(store, 5, heartbeat_s=0.01, poll_s=0.01)
    store.raw.delete_key(keys.spare_claim(5))
    store.raw.delete_key(keys.job_end())
    assert pool.claim(store, activation)  # the decider's genuine claim
    assert pool.wait_for_claim(store, 5, heartbeat_s=0.01, poll_s=0.01) == activation


def test_a_forged_flag_is_as_if_absent():
    """Keys obeyed for being there: a forged "change under way" starts no change, a forged
    "shrunk" withholds no spare, a forged "taken in" ends no wait (found by review: `check` alone
    obeyed them without opening them)."""
    from accelpact.membership import transfer
    from accelpact.membership.sealed import holds

    store = sealed()
    for key in (keys.changing(0), keys.shrunk()):
        store.raw.set(key, "1")
        assert store.check([key]) and not holds(store, key)
        store.set(key, "1")
        assert holds(store, key)
    store.raw.set(keys.taken_in(1, 3), "ok")
    with pytest.raises(transfer.TransferError, match="fails authentication"):
        transfer.await_taken_in(store, 1, [3], floor_s=0.1)
    store.set(keys.taken_in(1, 3), "ok")
    assert transfer.await_taken_in(store, 1, [3], floor_s=0.1) == 0.1


def test_a_forged_member_beat_counts_as_silence_never_as_a_certificate_or_an_error():
    """Found by review: a forged heartbeat raised ForgedValue (a ControlPlaneError) out of the
    boundary's silence watch, which the runtime reads as "a member may be lost"."""
    store = sealed()
    store.raw.set(keys.heartbeat(0, 1), "1|0|garbage")
    assert register.beat_of(store, 0, 1) is None
    store.set(keys.heartbeat(0, 1), liveness.beat_value(1, 0))
    assert register.beat_of(store, 0, 1) == liveness.beat_value(1, 0).encode()


def test_a_spare_whose_beat_fails_authentication_is_not_offered():
    """A spare started without the job's secret (or a forged beat): never seen to move, so it is
    not offered, and the change goes on with the spares that are."""
    store = sealed()
    for spare in (4, 5):
        pool.register(store, spare)
    watch = pool.SpareWatch(quiet_s=0.3, every_s=0.0)
    beats = 0
    while True:
        beats += 1
        store.set(keys.spare_alive(4), liveness.beat_value(beats, pool.SPARE_WORLD))  # a genuine spare beating
        store.raw.set(keys.spare_alive(5), liveness.beat_value(beats, pool.SPARE_WORLD))  # one without the secret
        states = watch.states(watch.look(store, force=True))
        if "watching" not in states.values():
            break
    assert states == {4: "alive", 5: "gone"}


def test_a_garbled_beat_is_no_death_certificate_and_no_crash():
    """Found while sealing: a beat without the "where/pid/start" tail raised ValueError in the
    decider's watch (a store client could crash every survivor's membership change with one)."""
    assert liveness.is_dead("1|0|x", 0) is None
    assert liveness.is_dead(liveness.beat_value(1, 0), 0) is False  # this process: alive
