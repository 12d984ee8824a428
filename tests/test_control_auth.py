"""A hostile client of the rendezvous store cannot decide a recovery: forged, replayed and garbage
values in every key it can guess (given the namespace, the worst case) are never obeyed."""

from __future__ import annotations

import pytest

from accelpact.control.auth import ForgedValue, Sealer
from accelpact.testing.spawn import run_world


def test_a_sealed_value_opens_only_in_its_own_context():
    sealer = Sealer(b"k" * 32, "attempt0/abc")
    raw = sealer.seal("resume", "r1", "outcome")
    assert sealer.open(raw, "r1", "outcome") == "resume"
    for context in (("r2", "outcome"), ("r1", "vote")):  # replay into another recovery or key
        with pytest.raises(ForgedValue, match="fails authentication"):
            sealer.open(raw, *context)
    with pytest.raises(ForgedValue):  # same secret, another attach
        Sealer(b"k" * 32, "attempt0/def").open(raw, "r1", "outcome")
    with pytest.raises(ForgedValue):  # another secret
        Sealer(b"x" * 32, "attempt0/abc").open(raw, "r1", "outcome")
    tampered = raw.replace("resume", "reject")
    with pytest.raises(ForgedValue):
        sealer.open(tampered, "r1", "outcome")
    with pytest.raises(ForgedValue, match="unsigned or malformed"):
        sealer.open(b"resume", "r1", "outcome")


def test_a_hostile_value_is_a_forged_value_not_a_crash():
    """Found by review: a MAC with a non-ASCII character made compare_digest raise TypeError, and
    nesting deeper than the parser's stack raised RecursionError: neither was ForgedValue, so the
    rank crashed (no evidence, no exit 75) where it should have rejected as forged."""
    import json

    sealer = Sealer(b"k" * 32, "attempt0/abc")
    with pytest.raises(ForgedValue, match="fails authentication"):
        sealer.open(json.dumps({"v": '"resume"', "mac": "\u00e9" * 64}), "r1", "outcome")
    with pytest.raises(ForgedValue, match="unsigned or malformed"):
        sealer.open("[" * 100_000 + "]" * 100_000, "r1", "outcome")


def _hostile(rank: int, world_size: int) -> dict:
    import json

    import torch.distributed as dist

    from accelpact.control import ControlPlane
    from accelpact.fsm.effects import VoteRelease
    from accelpact.runtime.release import vote_release

    control = ControlPlane(timeout_s=3.0, attempt=0)
    attacker = control.store  # knows the namespace: the worst case

    def forge(epoch: str) -> None:
        if rank == 0:
            attacker.set(f"{epoch}/outcome", "resume")  # plain value
            for r in range(world_size):  # every vote says ok, signed with a guessed key
                attacker.set(f"{epoch}/vote/{r}", json.dumps({"v": json.dumps({"ok": True, "reason": ""}),
                                                             "mac": "0" * 64}))
        dist.barrier(group=control.group)

    out: dict = {}
    # r1: the register and the votes are forged before anyone votes; rank 1 votes against release
    forge("r1")
    out["r1"] = vote_release(control, "r1", VoteRelease(ok=rank == 0, reason="" if rank == 0 else "proof failed"))
    out["r1_reasons"] = control.release_reasons("r1")
    # r2: a genuine release, both ok
    out["r2"] = vote_release(control, "r2", VoteRelease(ok=True))
    # r3: the genuine signed "resume" of r2 replayed into r3's register; rank 1 votes against
    if rank == 0:
        attacker.set("r3/outcome", attacker.get("r2/outcome"))
    dist.barrier(group=control.group)
    out["r3"] = vote_release(control, "r3", VoteRelease(ok=rank == 0, reason="validation failed"))
    # r4: garbage bytes in the register
    if rank == 0:
        attacker.set("r4/outcome", bytes(range(256)))
    dist.barrier(group=control.group)
    out["r4"] = vote_release(control, "r4", VoteRelease(ok=True))
    control.close()
    return out


@pytest.mark.timeout(90)
def test_no_rank_resumes_on_a_forged_replayed_or_garbage_value():
    for out in run_world(_hostile, 2, timeout_s=60):
        assert out["r1"] == "reject" and out["r3"] == "reject" and out["r4"] == "reject", out
        assert out["r2"] == "resume"  # the genuine release still works
        assert any(why.startswith("not obeyed: unsigned or malformed value") for why in out["r1_reasons"])


def _given_secret(rank: int, world_size: int, same: bool) -> str:
    import os

    from accelpact.control import ControlPlane
    from accelpact.errors import ControlPlaneError

    if same == "rank 0 only":  # found by review: only the ranks given one checked, the others hung
        if rank == 0:
            os.environ["ACCELPACT_SECRET"] = "job-secret"
        else:
            os.environ.pop("ACCELPACT_SECRET", None)
    else:
        os.environ["ACCELPACT_SECRET"] = "job-secret" if same or rank == 0 else "another"
    try:
        ControlPlane(timeout_s=5.0, attempt=0).close()
        return "ok"
    except ControlPlaneError as exc:
        return str(exc)


@pytest.mark.timeout(60)
def test_a_given_secret_must_be_the_same_on_every_rank():
    assert run_world(_given_secret, 2, True, timeout_s=45) == ["ok", "ok"]
    for out in run_world(_given_secret, 2, False, timeout_s=45):
        assert "ACCELPACT_SECRET differs between ranks" in out
    for out in run_world(_given_secret, 2, "rank 0 only", timeout_s=45):
        assert "ACCELPACT_SECRET differs between ranks (or is set on some ranks only)" in out


def test_a_forged_vote_is_never_counted_for_the_rank_it_names():
    """`collect_votes` opens each vote in its own context (epoch, "vote", rank): an unsigned one, one
    signed with a guessed key, and a genuine vote of rank 0 replayed under rank 1's key all count as
    missing, with the reason kept. Found by review: the end-to-end test's forged votes were always
    overwritten by the ranks' own, so dropping this check went unnoticed."""
    import datetime
    import json

    import torch.distributed as dist

    from accelpact.control.plane import ControlPlane, ReleaseVote

    def plane(sealer: Sealer) -> ControlPlane:
        p = ControlPlane.__new__(ControlPlane)
        p.store, p.world_size, p.sealer, p.clock, p.seq, p.forged = store, 2, sealer, None, 0, {}
        p.timeout = datetime.timedelta(seconds=0.2)
        return p

    key, namespace = b"k" * 32, "attempt0/abc"
    store = dist.HashStore()
    rank0 = plane(Sealer(key, namespace))
    rank0.post_vote("r5", ReleaseVote(0, True, ""))
    genuine = rank0.collect_votes  # rank 0 collects
    forgeries = {
        "unsigned": json.dumps({"ok": True, "reason": ""}),
        "a guessed key": Sealer(b"x" * 32, namespace).seal({"ok": True, "reason": ""}, "r5", "vote", 1),
        "rank 0's vote replayed as rank 1's": store.get("r5/vote/0"),
    }
    for why, forged in forgeries.items():
        rank0.forged.clear()
        store.set("r5/vote/1", forged)
        votes = genuine("r5")
        assert votes[0] == ReleaseVote(0, True, "") and votes[1] is None, why
        assert len(rank0.forged["r5"]) == 1, why
    plane(Sealer(key, namespace)).post_vote("r5", ReleaseVote(1, False, "proof failed"))
    assert genuine("r5")[1] == ReleaseVote(1, False, "proof failed")  # the real one is read as it is
