"""Communicator lifecycle on a real 4-rank gloo world: make, validate, fault, replace, retire.

The world (shared with ``test_rebind_ddp``) is ``accelpact.testing.worlds.comm_and_ddp_world``.
"""

from __future__ import annotations

import pytest

from accelpact.comm import FailureCause, classify_failure
from accelpact.testing.worlds import comm_and_ddp_results

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(360)]

REPLICATE = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


@pytest.fixture(scope="module")
def comm() -> list[dict]:
    return [result["comm"] for result in comm_and_ddp_results()]


def test_group_is_registered_resolvable_and_has_the_explicit_timeout(comm):
    for rank, result in enumerate(comm):
        registered = result["registered"]
        assert registered["name"] == "accelpact:c-replicate:g0"
        assert registered["resolves"] and registered["mesh_resolves"]
        assert registered["ranks"] == REPLICATE[rank]
        assert registered["rank_in_group"] == REPLICATE[rank].index(rank)
        assert registered["backend_timeout_s"] == 20.0


def test_members_arriving_late_still_build_the_group(comm):
    assert comm[1]["make_ms"] >= 900  # waited for rank 3, which came 1 s late
    assert comm[2]["replaced"]["validated"] == 2  # rank 2 came 0.5 s late to the replacement


def test_validation_sums_member_ranks_and_rejects_wrong_members(comm):
    for rank, result in enumerate(comm):
        assert result["validate"]["observed_sum"] == sum(REPLICATE[rank])
        assert result["validate"]["elapsed_us"] > 0
        assert result["wrong_validation"]["type"] == "GroupValidationError"
        assert result["shard_still_works"]


def test_misuse_is_refused_before_anything_changes(comm):
    for result in comm:
        assert result["non_member"]["type"] == "MembershipError"
        assert result["wrong_membership"]["type"] == "MembershipError"
        assert "differs" in result["wrong_membership"]["message"]
        assert result["duplicate_name"]["type"] == "ValueError"
        # a successor keeps the name but never a live generation (they would share store keys)
        assert result["same_generation"]["type"] == "ValueError"
        assert "is generation 'accelpact:c-shard:g0' already" in result["same_generation"]["chain"][0][1]


def test_skipped_collective_times_out_and_other_groups_survive(comm):
    fault = comm[0]["fault"]
    assert fault["cause"] == "TIMEOUT"
    assert "Timed out waiting" in fault["chain"][-1][1]
    assert all(result["shard_after_fault"] for result in comm)
    assert all(result["fault"] is None for result in comm[1:])


def test_replacement_retires_the_old_group(comm):
    for rank, result in enumerate(comm):
        replaced = result["replaced"]
        # the successor keeps the name (meshes and compiled regions hold it) and is generation 1
        assert replaced["name"] == "accelpact:c-replicate:g0" and replaced["identity"] == "accelpact:c-replicate:g1"
        assert replaced["old_name_resolves_to_new"]
        assert replaced["retired"]
        assert replaced["retire_again"] is False  # idempotent
        assert replaced["validated"] == sum(REPLICATE[rank])


def test_using_a_retired_broken_group_classifies_as_retired(comm):
    for rank in (0, 2):
        through_c10d = comm[rank]["stale_c10d"]
        assert through_c10d["cause"] == "RETIRED_COMMUNICATOR"
        assert "world group map" in through_c10d["chain"][0][1]  # c10d masks the gloo error…
        assert len(through_c10d["chain"]) == 2  # …which is its __context__
        assert comm[rank]["stale_raw"]["cause"] == "RETIRED_COMMUNICATOR"  # told which group the step used
        assert comm[rank]["stale_raw_traceback"]["cause"] == "RETIRED_COMMUNICATOR"  # found in the frames


def test_captured_gloo_errors_classify_by_text_alone(comm):
    """Rebuild the real chains (pickling drops __context__) and classify them without any hint."""
    for rank in (0, 2):
        chain = comm[rank]["stale_c10d"]["chain"]
        inner = RuntimeError(chain[1][1])
        outer = ValueError(chain[0][1])
        outer.__context__ = inner
        result = classify_failure(outer)
        assert result.cause is FailureCause.RETIRED_COMMUNICATOR
        assert result.message == chain[1][1]
        bare = classify_failure(RuntimeError(comm[rank]["stale_raw"]["chain"][0][1]))
        assert bare.cause in (FailureCause.TIMEOUT, FailureCause.CONNECTION_CLOSED)


def test_pinned_gloo_retired_healthy_group_still_works(comm):
    """Gloo's shutdown does not poison a healthy group: a stale reference to it keeps working.

    So the guarantee against stale references is the rebind proof, not a failure. If torch starts
    to fail such calls, this test fails and the docs (lifecycle, NOTES) must follow.
    """
    for rank in (1, 3):
        assert comm[rank]["stale_c10d"] is None
        assert comm[rank]["stale_raw"] is None


def crossed_validation(rank: int, world_size: int) -> dict:
    """Two groups over the same pair, validated in opposite orders on the two ranks."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from accelpact.comm import GroupValidationError, make_group
    from accelpact.comm.validate import validate_groups

    a, b = (make_group([0, 1], label=label, timeout=3) for label in ("va", "vb"))
    t = time.perf_counter()
    order = [(a, [0, 1]), (b, [0, 1])] if rank == 0 else [(b, [0, 1]), (a, [0, 1])]
    sums = [r.observed_sum for r in validate_groups(order, timeout=datetime.timedelta(seconds=3))]
    elapsed = time.perf_counter() - t
    with pytest.raises(GroupValidationError, match="rank sum 1 != 2"):
        validate_groups([(a, [0, 1]), (b, [0, 2])])  # b's claimed members are wrong
    after = torch.ones(1)
    dist.all_reduce(after, group=a)  # a was waited for too: its next collective pairs up
    return {"sums": sums, "elapsed": elapsed, "after": int(after)}


@pytest.mark.timeout(60)
def test_validations_of_several_groups_are_all_in_flight_at_once():
    """A Rewind validates every group: each rank posts all of them before waiting, so two ranks
    that list the groups in different orders do not wait for each other until the timeout."""
    from accelpact.testing.spawn import run_world

    for r in run_world(crossed_validation, 2, timeout_s=45, pg_timeout_s=20):
        assert r["sums"] == [1, 1] and r["elapsed"] < 2.5 and r["after"] == 2
