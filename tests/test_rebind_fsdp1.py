"""FSDP1 HYBRID_SHARD on a real 4-rank gloo world (2 nodes × 2): fault, replace, rebind, bitwise.

The world (shared with ``test_rebind_fsdp2``) is ``accelpact.testing.worlds.fsdp_world``: a real
fault on replicate group {0,2} at a committed boundary, replacement, rebind, proof, validation,
a rotation of every group with the same plans, and a bitwise comparison with an uninterrupted run;
then the negative (no rebind).
"""

from __future__ import annotations

import pytest

from accelpact.testing.worlds import fsdp_results

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(360)]

LAYERS = 4
VARIANTS = ["fsdp1", "fsdp1-orig"]


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return fsdp_results()


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_continues_bitwise_equal_after_rebind(world, variant):
    for rank, result in enumerate(world):
        outcome = result[variant]
        assert outcome["compared"] > 0
        assert outcome["mismatches"] == [], f"rank {rank}: {outcome['mismatches']}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_inter_node_group_has_two_references_per_unit(world, variant):
    for result in world:
        replicate = result[variant]["plans"]["replicate"]
        assert replicate["references"] == 2 * (LAYERS + 1)
        assert replicate["names"] == 0
        assert replicate["counts"] == {"fsdp1.inter_node_pg": LAYERS + 1, "fsdp1.inter_node_state": LAYERS + 1}
        assert "layers.3._inter_node_state.process_group" in replicate["paths"]
        assert "_inter_node_pg" in replicate["paths"]  # the root unit


@pytest.mark.parametrize("variant", VARIANTS)
def test_intra_node_group_references(world, variant):
    for result in world:
        shard = result[variant]["plans"]["shard"]
        assert shard["counts"] == {"fsdp1.process_group": LAYERS + 1, "fsdp1.handle": LAYERS + 1,
                                   "fsdp1.exec_order": 1}


def test_mesh_adds_one_registry_reference_and_one_name(world):
    for result in world:
        replicate = result["counts-fsdp1-mesh"]["replicate"]
        assert replicate["references"] == 2 * (LAYERS + 1) + 1
        assert replicate["counts"]["mesh.pg_registry"] == 1
        assert replicate["names"] == 1 and replicate["counts"]["mesh.dim_group_name"] == 1


def test_reference_count_at_eight_layers(world):
    for result in world:
        counts = result["counts-fsdp1-l8"]
        assert counts["replicate"]["references"] == 2 * (8 + 1)
        assert counts["shard"]["references"] == 2 * (8 + 1) + 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_real_fault_is_a_timeout_and_the_recovery_is_proven(world, variant):
    assert world[0][variant]["fault"]["cause"] == "TIMEOUT"
    for rank in (0, 2):
        recovery = world[rank][variant]["recovery"]
        assert recovery["references"] == 2 * (LAYERS + 1)
        assert recovery["deep_complete"], recovery["deep_unrecorded"]
        assert recovery["validated_sum"] == 0 + 2
    for rank in (1, 3):
        assert "recovery" not in world[rank][variant]  # not members of the failed group: untouched


@pytest.mark.parametrize("variant", VARIANTS)
def test_proof_names_a_deliberately_skipped_site(world, variant):
    for rank in (0, 2):
        skipped = world[rank][variant]["recovery"]["skip_detected"]
        assert skipped is not None, "prove() passed although a site was skipped"
        assert skipped["paths"] == [skipped["victim"]]


def test_plans_are_reused_for_later_generations(world):
    for rank, result in enumerate(world):
        for variant in VARIANTS:
            for label, rotation in result[variant]["rotation"].items():
                assert rotation["deep_complete"], (label, rotation["deep_unrecorded"])
                assert rotation["new"] == result[variant]["final_groups"][label]
        # replicate {0,2}: g0 →fault g1 →rotation g2 →fault g3 →rotation g4; {1,3}: two rotations
        expected = "accelpact:replicate:g4" if rank in (0, 2) else "accelpact:replicate:g2"
        assert result["fsdp1-orig"]["final_groups"]["replicate"] == expected
        assert result["fsdp1-orig"]["final_groups"]["shard"] == "accelpact:shard:g2"
        # every generation under the name the wrappers were built with
        assert result["fsdp1-orig"]["final_names"] == {"replicate": "accelpact:replicate:g0", "shard": "accelpact:shard:g0"}


def test_without_rebind_the_next_update_fails_as_retired_communicator(world):
    for rank in (0, 2):
        step = world[rank]["stale-fsdp1"]["step"]
        assert step is not None and step["cause"] == "RETIRED_COMMUNICATOR", step
        assert "world group map" in step["chain"][0]  # c10d's masking error, unwrapped below
    for rank in (1, 3):  # stranded by their failed shard peers
        step = world[rank]["stale-fsdp1"]["step"]
        assert step is not None and step["cause"] in ("TIMEOUT", "CONNECTION_CLOSED"), step
