"""Replica digest agreement (silent data corruption): the pure decision, the config, and spawned
worlds where one bit of one replica's Adam exp_avg is flipped at a chosen update -- with two
holders per shard (HSDP 2x2) every rank fails stop naming the ranks and the tensor; with three
holders (DDP on 3 ranks) the corrupt rank is repaired in memory and the run ends bitwise equal
to an uninterrupted one, also with deferred boundaries (a digest-due boundary is synchronous)."""

from __future__ import annotations

import pytest

from accelpact.config import Config
from accelpact.errors import ConfigError
from accelpact.integrity import HolderDigest, decide_agreement
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world
from model_checking.trace_validation import assert_valid_run

NAMES = ("param:w", "optim:0:exp_avg", "optim:0:step")


def reports(holders_of: dict[int, tuple[int, ...]], digests: dict[int, str]) -> list[HolderDigest]:
    return [HolderDigest(r, holders_of[r], digests[r]) for r in sorted(digests)]


def hsdp(digests: dict[int, str]) -> list[HolderDigest]:  # 2x2: replicate groups {0,2}, {1,3}
    return reports({0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}, digests)


def ddp(digests: dict[int, str]) -> list[HolderDigest]:
    group = tuple(sorted(digests))
    return reports(dict.fromkeys(digests, group), digests)


# ---------------------------------------------------------------- the pure decision ------------
def test_equal_replicas_agree_and_a_single_holder_has_nothing_to_compare():
    assert decide_agreement(hsdp({0: "a", 2: "a", 1: "b", 3: "b"})).outcome == "agree"
    assert decide_agreement(reports({0: (0,), 1: (1,)}, {0: "x", 1: "y"})).outcome == "agree"  # fully sharded


def test_the_minority_of_three_or_more_holders_is_repaired_from_the_majority():
    v = decide_agreement(ddp({0: "a", 1: "bad", 2: "a"}), names=NAMES,
                         words={0: [1, 2, 3], 1: [1, 9, 3], 2: [1, 2, 3]})
    assert v.outcome == "repair"
    (shard,) = v.shards
    assert shard.majority == (0, 2) and shard.source == {1: 0} and shard.agreed_digest == "a"
    assert shard.tensors == {1: ("optim:0:exp_avg",)}
    assert "rank(s) [1]" in v.reasons[0] and "optim:0:exp_avg" in v.reasons[0]
    # two corrupt ranks of five: each gets its own source, round-robin over the majority
    v = decide_agreement(ddp({0: "a", 1: "x", 2: "a", 3: "y", 4: "a"}))
    assert v.outcome == "repair" and v.shards[0].source == {1: 0, 3: 2}


def test_two_holders_that_differ_reject_naming_the_ranks_and_the_tensors():
    v = decide_agreement(hsdp({0: "a", 2: "flipped", 1: "b", 3: "b"}), names=NAMES,
                         words={0: [1, 2, 3], 2: [1, 7, 3], 1: [4, 5, 6], 3: [4, 5, 6]})
    assert v.outcome == "reject"
    assert v.reasons == ("shard replicate[0,2]: replicas differ, ranks [0, 2] hold 2 different digests; "
                         "differing tensors: rank 2 vs rank 0: optim:0:exp_avg; two holders cannot tell which "
                         "copy is corrupt",)
    assert [s.outcome for s in v.shards] == ["reject", "agree"]


def test_without_a_strict_majority_even_many_holders_reject():
    assert decide_agreement(ddp({0: "a", 1: "a", 2: "b", 3: "b"})).outcome == "reject"  # a tie
    v = decide_agreement(ddp({0: "a", 1: "b", 2: "c"}))
    assert v.outcome == "reject" and "no strict majority" in v.reasons[0]


def test_several_shards_are_decided_each_and_a_reject_anywhere_wins():
    holders = {0: (0, 2, 4), 2: (0, 2, 4), 4: (0, 2, 4), 1: (1, 3), 3: (1, 3)}
    repair_only = decide_agreement(reports(holders, {0: "a", 2: "a", 4: "z", 1: "b", 3: "b"}))
    assert repair_only.outcome == "repair" and [s.outcome for s in repair_only.shards] == ["repair", "agree"]
    both = decide_agreement(reports(holders, {0: "a", 2: "a", 4: "z", 1: "b", 3: "c"}))
    assert both.outcome == "reject" and len(both.reasons) == 1 and "replicate[1,3]" in both.reasons[0]


def test_reports_that_do_not_fit_reject_rather_than_guess():
    v = decide_agreement(reports({0: (0, 2), 2: (1, 2), 1: (1,)}, {0: "a", 2: "a", 1: "a"}))
    assert v.outcome == "reject" and any("different replicate groups" in r for r in v.reasons)
    v = decide_agreement(reports({0: (0, 2)}, {0: "a"}))
    assert v.outcome == "reject" and v.reasons == ("rank 0's replica peer 2 sent no digest",)


def test_digest_every_is_off_by_default_comes_from_the_environment_and_refuses_bad_values():
    assert Config().digest_every == 0
    assert Config().with_env({"ACCELPACT_DIGEST_EVERY": "10"}).digest_every == 10
    with pytest.raises(ConfigError, match="digest_every must be an integer >= 0.*got -1"):
        Config(digest_every=-1)
    with pytest.raises(ConfigError, match="digest_every"):
        Config().with_env({"ACCELPACT_DIGEST_EVERY": "-3"})


# ---------------------------------------------------------------- spawned worlds ----------------
@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_two_holders_that_differ_fail_stop_naming_the_ranks_and_the_tensor(tmp_path):
    drill = Drill(framework="fsdp2", updates=4, digest_every=1, flip_bit=(2, 2), reference=False,
                  data_timeout_s=1.5, control_timeout_s=8.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(run_drill, 4, drill, timeout_s=180, pg_timeout_s=30)
    for r in results:
        assert r["rejected"] is not None, r
        (why,) = r["rejected"]
        assert why.startswith("replica digest check at F=2: shard replicate[0,2]: replicas differ, ranks [0, 2]"), why
        assert "rank 2 vs rank 0:" in why and "exp_avg" in why and "two holders cannot tell" in why
        assert r["frontier"] == 2 and r["history"][-1]["action"] == "reject"
        assert [c["outcome"] for c in r["digests"]] == ["agree", "reject"]  # F=1 agreed, F=2 did not
        assert r["evidence"]  # the fail-stop left its evidence


@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.parametrize("boundary", ["sync", "deferred"])
def test_a_corrupt_replica_among_three_is_repaired_in_memory_bitwise(tmp_path, boundary):
    drill = Drill(framework="ddp", local=1, layers=1, updates=5, digest_every=2, flip_bit=(4, 1),
                  boundary=boundary, rewind=boundary == "deferred", envelope="permissive",
                  data_timeout_s=1.5, control_timeout_s=8.0, trace_dir=str(tmp_path / "trace"))
    results = run_world(run_drill, 3, drill, timeout_s=200, pg_timeout_s=30)
    for r in results:
        assert r["rejected"] is None, r["rejected"]
        assert r["frontier"] == r["opt_step"] == 5 and r["history"] == []
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
        outcomes = [(c["frontier"], c["outcome"]) for c in r["digests"]]
        assert outcomes == [(2, "agree"), (4, "repair")], outcomes
        (shard,) = r["digests"][1]["verdict"]["shards"]
        assert shard["source"] == {"1": 0} and shard["tensors"] == {"1": ["optim:0:exp_avg"]}
        assert r["digests"][1]["repaired_bytes"] > 0 if r["rank"] in (0, 1) else True
        if boundary == "deferred":  # every boundary but the digest-due ones (F=2, 4) was deferred
            assert r["deferral"]["deferred"] == 3, r["deferral"]
    assert_valid_run(tmp_path / "trace")


def _naive_layout_reasons(by_rank):
    reasons = []
    for rank, report in sorted(by_rank.items()):
        if rank not in report.holders:
            reasons.append(f"rank {rank} reports holders {list(report.holders)} that do not include itself")
        for peer in report.holders:
            if peer not in by_rank:
                reasons.append(f"rank {rank}'s replica peer {peer} sent no digest")
            elif by_rank[peer].holders != report.holders:
                reasons.append(f"ranks {rank} and {peer} name different replicate groups "
                               f"{list(report.holders)} and {list(by_rank[peer].holders)}")
    return sorted(set(reasons))


def test_the_layout_check_per_distinct_group_gives_every_reason_of_the_per_peer_check():
    """The layout is checked once per distinct group (the per-peer comparison was W³ for DDP):
    on consistent and broken layouts alike, the same reasons as rank-by-rank, peer-by-peer."""
    import random

    from accelpact.integrity.agreement import _layout_reasons

    rng = random.Random(3)
    for _ in range(300):
        world = rng.randint(1, 9)
        size = rng.choice([g for g in range(1, world + 1) if world % g == 0])
        groups = [tuple(range(s, s + size)) for s in range(0, world, size)]
        by_rank = {r: HolderDigest(r, groups[r // size], "d") for r in range(world)}
        for _ in range(rng.randint(0, 2)):  # break it: a rank missing, a wrong group, a stranger
            r = rng.randrange(world)
            kind = rng.choice(["drop", "wrong", "foreign"])
            if kind == "drop":
                by_rank.pop(r, None)
            elif kind == "wrong":
                by_rank[r] = HolderDigest(r, tuple(sorted(rng.sample(range(world), rng.randint(1, world)))), "d")
            else:
                by_rank[r] = HolderDigest(r, (r, world + 1), "d")
        assert _layout_reasons(by_rank) == _naive_layout_reasons(by_rank), by_rank


def test_the_digest_holders_compare_leaves_each_replicas_buffers_out():
    """Found by review: BatchNorm's running statistics are updated from each rank's own batch (DDP
    broadcasts rank 0's at the start of each forward, FSDP never), so healthy replicas differ in
    them, and a digest over every byte rejected any such model at its first check (and a spare's
    transfer wherever two holders survived). Holders compare parameters and optimizer state; a
    spare still checks every byte it receives against its source's full digest."""
    import torch

    from accelpact.membership import transfer

    def replica(mean: float):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        model[1].running_mean.fill_(mean)  # this replica's own batches
        return model, opt

    (a, opt_a), (b, opt_b) = replica(0.1), replica(0.2)
    layout = transfer.manifest(a, opt_a)
    buf_a, buf_b = transfer.pack(a, opt_a), transfer.pack(b, opt_b)
    assert transfer.digest(buf_a) != transfer.digest(buf_b)  # every byte: they differ
    assert transfer.shared_digest(buf_a, layout) == transfer.shared_digest(buf_b, layout)
    names, _ = transfer.tensor_words(a, opt_a)
    assert names and not any(n.startswith("buffer:") for n in names)
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1.0  # a parameter differs: that is corruption
    assert transfer.shared_digest(transfer.pack(b, opt_b), layout) != transfer.shared_digest(buf_a, layout)
    with pytest.raises(transfer.TransferError, match="the layout accounts for"):
        transfer.shared_digest(buf_a[:-4], layout)


def test_a_repair_is_given_time_for_the_largest_shard_every_rank_waits_for():
    """Found by review: the repair's transfers and the verification gather ran under the fixed
    bound after a commit, so once a shard passed a few GB every rank outside the repair gave up in
    that gather and a repairable divergence became a lost member or a Reject. The bound now grows
    with the largest shard (moved at the slowest rate allowed, hashed three times), the same on
    every rank."""
    from types import SimpleNamespace

    from accelpact.membership import transfer
    from accelpact.runtime.digests import _repair_bound_s

    rt = SimpleNamespace(control=SimpleNamespace(gather_ints=lambda words: [(10**9,), (words[0],)], timeout_s=8.0))
    expected = 8.0 + 10**9 / transfer.SLOWEST_TRANSFER_BPS + 3 * 10**9 / transfer.SLOWEST_HASH_BPS
    assert _repair_bound_s(rt, 5) == _repair_bound_s(rt, 10**9) == pytest.approx(expected)  # every rank alike
    assert expected > 40  # where 8 s failed every shard over ~4 GB
