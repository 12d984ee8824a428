"""Review fixes to discovery, rebind and proof, in one process on c10d's fake backend (world 4, rank 0).

A DDP built-in comm hook is refused, a dict that maps the group to itself is rebound whole and the
proof sees a retired key or set member, FSDP2 per-parameter meshes are refused by name, and the
private c10d calls go through ``accelpact.comm._c10d`` (pinned here too).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.comm import _c10d
from accelpact.rebind import (
    RebindError,
    StaleReferenceError,
    UnknownWrapperError,
    data_plane_groups,
    discover,
)

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fake_world")  # tests/conftest.py: a 4-rank fake world


class Plain:
    pass


# -------------------------------------------------------------------------------------------- DDP built-in hook


@pytest.mark.parametrize("hook", ["ALLREDUCE", "FP16_COMPRESS"])
def test_ddp_with_a_builtin_comm_hook_is_refused_naming_the_hook(hook):
    """The C++ hook copies the group at registration; `_update_process_group` leaves that copy, so
    the next backward all-reduced on the retired group behind a passing proof."""
    from torch.nn.parallel import DistributedDataParallel

    group = dist.new_group([0, 2])
    model = DistributedDataParallel(nn.Linear(4, 4), process_group=group)
    model._register_builtin_comm_hook(getattr(dist.BuiltinCommHookType, hook))
    with pytest.raises(UnknownWrapperError, match=rf"built-in comm hook BuiltinCommHookType\.{hook}") as err:
        discover(model, group)
    assert "register_comm_hook" in str(err.value)  # says what to use instead


def test_ddp_with_a_python_comm_hook_state_object_is_still_rebound():
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    group = dist.new_group([0, 2])
    model = DistributedDataParallel(nn.Linear(4, 4), process_group=group)
    state = SimpleNamespace(process_group=group)
    model.register_comm_hook(state, _noop_hook)
    plan = discover(model, group)
    plan.rebind(new := dist.new_group([0, 2]))
    plan.prove()
    assert state.process_group is new and model.process_group is new


def _noop_hook(state, bucket):
    raise AssertionError("never runs on the fake backend")


# -------------------------------------------------------------------------------------------- dict keyed by the group


def test_a_dict_that_maps_the_group_to_itself_is_rebound_whole():
    """{g: g}: the key moved to the new group, then the item write put the retired key back."""
    group = dist.new_group([0, 2])
    holder = Plain()
    holder.by_group = {group: group}
    holder.other = {group: "value"}
    plan = discover(holder, group)
    for _ in range(2):  # the plan follows its group
        new = dist.new_group([0, 2])
        plan.rebind(new)
        plan.prove()
        assert len(holder.by_group) == 1 and holder.by_group.get(new) is new
        assert holder.other == {new: "value"}
        assert plan.verify_deep().complete


def test_the_proof_names_a_retired_key_or_set_member_beside_the_new_one():
    group = dist.new_group([0, 2])
    holder = Plain()
    holder.keyed = {group: "value"}
    holder.members = {group}
    plan = discover(holder, group)
    plan.rebind(dist.new_group([0, 2]))
    plan.prove()
    holder.keyed[group] = "value"
    holder.members.add(group)
    with pytest.raises(StaleReferenceError) as err:
        plan.prove()
    assert err.value.paths == ["keyed<key ProcessGroup> still holds the retired group too",
                               "members{member} still holds the retired group too"]


# -------------------------------------------------------------------------------------------- FSDP2 per-parameter meshes


def _per_parameter_mesh_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult
    from torch.distributed.tensor import Shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    ep_info = FSDPMeshInfo(init_device_mesh("cpu", (4,), mesh_dim_names=("ep",)), shard_mesh_dim=0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    expert = model[1].weight
    fully_shard(model, mesh=mesh, shard_placement_fn=lambda p: ShardPlacementResult(Shard(0), ep_info)
                if p is expert else None)
    assert len(model._get_fsdp_state()._fsdp_param_groups) == 2
    return model, mesh


def test_fsdp2_per_parameter_meshes_are_refused_naming_the_extra_param_group():
    model, _ = _per_parameter_mesh_model()
    with pytest.raises(RebindError, match=re.escape("['1.weight'] on the mesh ('ep',) (shard ")):
        data_plane_groups(model)


def test_the_shrink_proof_reads_every_param_group_of_a_unit():
    from accelpact.rebind import reshape

    model, mesh = _per_parameter_mesh_model()
    reshape.proof(model, [mesh], world_size=4, rank=0)  # torch's singular accessor raised AssertionError
    assert reshape._refresh_mesh_infos(model) == 2


# -------------------------------------------------------------------------------------------- private c10d calls


#: files that still call c10d privates directly; each is someone else's to route through `_c10d`
_PENDING = {"accelpact/testing/worlds.py": "test harness"}
_PRIVATE = re.compile(r"distributed_c10d\._|\bc10d\._|\._get_backend\(|\._device_types\b|_get_default_store|"
                      r"_get_default_group")


def test_private_c10d_calls_go_through_the_pinned_module():
    hits = []
    for path in sorted((ROOT / "accelpact").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "accelpact/comm/_c10d.py" or rel in _PENDING:
            continue
        hits += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                 if _PRIVATE.search(line.split("#", 1)[0])]
    assert not hits, hits


def test_pins_of_the_private_calls_the_c10d_module_makes():
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed import distributed_c10d as c10d

    assert isinstance(inspect.getattr_static(ProcessGroup, "_device_types"), property)
    assert callable(ProcessGroup._get_backend) and callable(c10d._get_default_group)
    assert _c10d.default_group() is dist.group.WORLD
    group = dist.new_group([0, 2])
    cpu = group._get_backend(torch.device("cpu"))
    assert any(backend is cpu for backend in _c10d.group_backends(group))


def test_pins_of_the_ddp_and_fsdp2_internals_the_rules_read():
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.nn.parallel import DistributedDataParallel

    assert "_set_comm_hook_name(str(comm_hook_type))" in inspect.getsource(
        DistributedDataParallel._register_builtin_comm_hook)
    assert "strs_map" in inspect.getsource(DistributedDataParallel._get_ddp_logging_data)
    assert "self._fsdp_param_groups: list[FSDPParamGroup] = []" in inspect.getsource(FSDPState.__init__)
