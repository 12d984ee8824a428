"""DDP over the replicate group on a real 4-rank gloo world; see test_rebind_fsdp1 for the flow."""

from __future__ import annotations

import pytest

from accelpact.testing.worlds import comm_and_ddp_results

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(360)]


@pytest.fixture(scope="module")
def ddp() -> list[dict]:
    return [result["ddp"] for result in comm_and_ddp_results()]


def test_training_continues_bitwise_equal_after_rebind(ddp):
    for rank, result in enumerate(ddp):
        recovery = result["recovery"]
        assert recovery["compared"] > 0
        assert recovery["mismatches"] == [], f"rank {rank}: {recovery['mismatches']}"


def test_python_attribute_and_cpp_reducer_are_both_sites(ddp):
    for result in ddp:
        assert result["labels"] == ["replicate"]
        plan = result["recovery"]["plans"]["replicate"]
        assert plan["counts"] == {"ddp.process_group": 1, "ddp.reducer": 1}
        assert plan["paths"] == ["process_group", "reducer"]


def test_recovery_is_proven_and_validated(ddp):
    assert ddp[0]["recovery"]["fault"]["cause"] == "TIMEOUT"
    for rank in (0, 2):
        recovery = ddp[rank]["recovery"]["recovery"]
        assert recovery["deep_complete"], recovery["deep_unrecorded"]
        assert recovery["validated_sum"] == 2
        assert recovery["skip_detected"]["paths"] == [recovery["skip_detected"]["victim"]]
    for result in ddp:
        assert result["recovery"]["rotation"]["replicate"]["deep_complete"]


def test_reducer_outside_its_ddp_is_refused(ddp):
    for result in ddp:
        refused = result["orphan_reducer"]
        assert refused is not None and refused["type"] == "UnknownWrapperError"
        assert "cached_reducer" in refused["chain"][0][1]


def test_without_rebind_the_next_update_fails_as_retired_communicator(ddp):
    for rank in (0, 2):  # the bare gloo error from the C++ reducer, attributed by the groups used
        step = ddp[rank]["stale"]["step"]
        assert step is not None and step["cause"] == "RETIRED_COMMUNICATOR", step
    for rank in (1, 3):  # their replicate group {1,3} is healthy: DDP does not involve the others
        assert ddp[rank]["stale"]["step"] is None
