"""Pins on the torch 2.13 internals that accelpact.comm and accelpact.rebind rely on.

Each test names one fact (see /work/shared/NOTES-torch.md). When torch moves, these fail first
and say which assumption broke, instead of a recovery silently rebinding half a model.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def test_torch_version_is_the_one_the_internals_were_verified_on():
    assert torch.__version__.startswith("2.13"), (
        f"torch {torch.__version__}: re-verify NOTES-torch.md and these pins, then update this test")


def test_c10d_world_tables_that_replacement_groups_are_entered_into():
    for table in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag"):
        assert isinstance(getattr(c10d._world, table), dict), table
    for name in ("_register_process_group", "_resolve_process_group", "_unregister_process_group"):
        assert callable(getattr(torch._C._distributed_c10d, name)), name
    assert callable(c10d._get_default_store)
    assert c10d.BackendConfig(c10d.Backend("gloo")).get_device_backend_map() == {"cpu": "gloo", "cuda": "gloo"}
    # destroy_process_group deletes exactly the entries register_group makes
    source = inspect.getsource(dist.destroy_process_group)
    for entry in ("pg_map[pg]", "pg_names[pg]", "pg_group_ranks[pg]", "pg_backend_config[pg]", "pg_to_tag[pg]",
                  "_unregister_process_group(pg.group_name)"):
        assert entry in source, entry


def test_c10d_helper_registers_the_same_tables():
    source = inspect.getsource(c10d._register_pg_in_world)
    for entry in ("pg_map[pg]", "pg_names[pg]", "pg_backend_config[pg]", "_register_process_group(group_name",
                  "tags_to_pg", "pg_to_tag[pg]"):
        assert entry in source, entry


def test_gloo_backend_can_be_built_directly():
    from torch._C._distributed_c10d import ProcessGroup, ProcessGroupGloo

    assert "timeout" in ProcessGroupGloo.__init__.__doc__
    options = ProcessGroupGloo._Options()
    for attribute in ("_timeout", "global_ranks_in_group", "group_name"):
        assert hasattr(options, attribute), attribute
    for method in ("_register_backend", "_set_default_backend", "_set_group_name", "_set_group_desc",
                   "set_timeout", "shutdown", "_get_backend"):
        assert hasattr(ProcessGroup, method), method
    assert hasattr(ProcessGroupGloo, "_set_sequence_number_for_group")


def test_fsdp1_keeps_the_inter_node_group_twice():
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState
    from torch.distributed.fsdp import _init_utils, _runtime_utils

    assert "process_group" in DefaultState.__slots__
    source = inspect.getsource(_init_utils._init_process_group_state_for_hybrid_shard)
    assert "state._inter_node_pg" in source
    assert "_inter_node_state" in inspect.getsource(_init_utils)
    assert "group=state._inter_node_pg" in inspect.getsource(_runtime_utils._reduce_grad)
    assert "state._exec_order_data.init(state, root_module, state.process_group)" in inspect.getsource(
        _runtime_utils)


def test_fsdp2_mesh_infos_cache_the_groups():
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo, FSDPMeshInfo, HSDPMeshInfo
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    assert issubclass(HSDPMeshInfo, FSDPMeshInfo) and issubclass(HSDPMeshInfo, DDPMeshInfo)
    assert "self.replicate_process_group = self.mesh.get_group" in inspect.getsource(DDPMeshInfo)
    assert "self.shard_process_group = self.mesh.get_group" in inspect.getsource(FSDPMeshInfo)
    assert "return self.mesh_info.replicate_process_group" in inspect.getsource(FSDPParamGroup)
    assert dataclasses.is_dataclass(HSDPMeshInfo)


def test_device_mesh_resolves_groups_by_name():
    from torch.distributed.device_mesh import DeviceMesh

    assert "_dim_group_names" in inspect.getsource(DeviceMesh.from_group)
    assert "_pg_registry[group.group_name] = group" in inspect.getsource(DeviceMesh.from_group)
    get_group = inspect.getsource(DeviceMesh.get_group)
    assert "_get_pg_from_name" in get_group and "_dim_group_names" in get_group


def test_dtensor_sharding_caches_can_be_cleared():
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    assert callable(_clear_sharding_prop_cache)
    assert hasattr(torch._C, "_clear_DTensor_sharding_propagator_cache")


def test_ddp_reducer_is_rebound_by_update_process_group():
    from torch.nn.parallel import DistributedDataParallel

    source = inspect.getsource(DistributedDataParallel._update_process_group)
    assert "self.reducer._update_process_group(new_process_group)" in source
    assert "self.process_group = new_process_group" in source


def test_every_group_is_built_by_the_helper_connections_wraps():
    """comm.connections records a group's sockets around c10d's `_new_process_group_helper`, which
    it swaps as a module global: the default group and new_group must both call it by that name."""
    assert callable(c10d._new_process_group_helper)
    assert "_new_process_group_helper(" in inspect.getsource(c10d.init_process_group)
    assert "_new_process_group_helper(" in inspect.getsource(c10d._new_group_with_tag)
    params = list(inspect.signature(c10d._new_process_group_helper).parameters)
    assert params[3] == "backend", params  # read positionally to leave NCCL groups alone


def test_attach_names_a_torch_other_than_the_verified_one(monkeypatch):
    """pyproject pins torch < 2.14; an environment that bypasses it is told at attach why a
    recovery may fail, not left to find out in one."""
    from accelpact.comm import _c10d

    assert _c10d.unverified_torch() is None  # the installed one
    monkeypatch.setattr(torch, "__version__", "2.14.0+cu126")
    assert "torch 2.14.0+cu126 is not the 2.13 release" in _c10d.unverified_torch()
    monkeypatch.setattr(torch, "__version__", "2.13.1+cpu")
    assert _c10d.unverified_torch() is None


def test_a_backend_reports_the_error_its_watchdog_recorded():
    """`_c10d.device_error`: an NCCL backend's `get_error()` (ErrorType, SUCCESS until its watchdog
    meets a failed collective) is how the boundary's device fence learns of a collective that failed
    inside an update without raising on the CPU."""
    from types import SimpleNamespace

    from torch._C._distributed_c10d import ErrorType

    from accelpact.comm import _c10d

    assert {e.name for e in (ErrorType.SUCCESS, ErrorType.TIMEOUT, ErrorType.COMM_ERROR, ErrorType.REMOTE_ERROR)} \
        == {"SUCCESS", "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR"}
    nccl = getattr(torch._C._distributed_c10d, "ProcessGroupNCCL", None)
    if nccl is not None:  # a CUDA build binds it on ProcessGroupNCCL (the CPU wheel has neither)
        assert callable(nccl.get_error)

    class Stuck:  # stands in for an NCCL backend whose watchdog met a timeout
        def _group_start(self): ...

        def get_error(self):
            return ErrorType.TIMEOUT

    class Fine(Stuck):
        def get_error(self):
            return ErrorType.SUCCESS

    class Group:
        def __init__(self, backend):
            self.backend = backend

        def _get_backend(self, device):
            assert device == torch.device("cuda")
            return self.backend

    real = _c10d.backend_config
    try:
        _c10d.backend_config = lambda pg: "cuda:nccl"
        assert _c10d.device_error(Group(Stuck())) == "TIMEOUT"
        assert _c10d.device_error(Group(Fine())) is None
        wrapper = SimpleNamespace(wrapped_pg=Stuck(), get_error=lambda: ErrorType.SUCCESS)  # DETAIL debug
        assert _c10d.device_error(Group(wrapper)) == "TIMEOUT"  # the NCCL backend inside it is read
        _c10d.backend_config = lambda pg: "cpu:gloo"
        assert _c10d.device_error(Group(Stuck())) is None  # not NCCL: nothing to read
    finally:
        _c10d.backend_config = real
