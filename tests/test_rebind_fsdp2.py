"""FSDP2 HSDP (``fully_shard`` on a 2-D mesh) on a real 4-rank gloo world; see test_rebind_fsdp1."""

from __future__ import annotations

import pytest

from accelpact.testing.worlds import fsdp_results

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(360)]

LAYERS = 4


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return fsdp_results()


def test_training_continues_bitwise_equal_after_rebind(world):
    for rank, result in enumerate(world):
        assert result["fsdp2"]["compared"] > 0
        assert result["fsdp2"]["mismatches"] == [], f"rank {rank}: {result['fsdp2']['mismatches']}"


def test_mesh_info_per_fully_shard_call_plus_the_mesh_tables(world):
    for result in world:
        replicate = result["fsdp2"]["plans"]["replicate"]
        counts = replicate["counts"]
        assert set(counts) == {"fsdp2.replicate_process_group", "mesh.pg_registry", "mesh.dim_group_name"}
        assert counts["fsdp2.replicate_process_group"] == LAYERS + 1
        # one registry entry and one name per mesh object: the model's mesh, plus any equal mesh
        # that DTensor's sharding cache swapped into a parameter's spec (here: the reference run's)
        assert counts["mesh.pg_registry"] == counts["mesh.dim_group_name"] >= 1
        assert replicate["references"] == LAYERS + 1 + counts["mesh.pg_registry"]
        assert any(path.endswith("._dim_group_names[0]") for path in replicate["paths"])
        shard = result["fsdp2"]["plans"]["shard"]
        assert shard["counts"]["fsdp2.shard_process_group"] == LAYERS + 1
        assert shard["counts"]["mesh.pg_registry"] >= 1
        assert shard["names"] > shard["counts"]["mesh.pg_registry"]  # + per-parameter shard submeshes


def test_recovery_is_proven_validated_and_skip_is_caught(world):
    assert world[0]["fsdp2"]["fault"]["cause"] == "TIMEOUT"
    for rank in (0, 2):
        recovery = world[rank]["fsdp2"]["recovery"]
        assert recovery["deep_complete"], recovery["deep_unrecorded"]
        assert recovery["validated_sum"] == 2
        skipped = recovery["skip_detected"]
        assert skipped is not None and skipped["paths"] == [skipped["victim"]]


def test_every_group_rotates_with_the_same_plans(world):
    for result in world:
        rotation = result["fsdp2"]["rotation"]
        assert set(rotation) == {"shard", "replicate"}
        for label, step in rotation.items():
            assert step["deep_complete"], (label, step["deep_unrecorded"])


def test_without_rebind_the_next_update_fails_as_retired_communicator(world):
    for rank in (0, 2):
        step = world[rank]["stale-fsdp2"]["step"]
        assert step is not None and step["cause"] == "RETIRED_COMMUNICATOR", step
    for rank in (1, 3):
        step = world[rank]["stale-fsdp2"]["step"]
        assert step is not None and step["cause"] in ("TIMEOUT", "CONNECTION_CLOSED"), step
