"""Which groups a wrapped model communicates on, under stable labels the runtime can key on.

HSDP has two: ``"shard"`` (within a node) and ``"replicate"`` (across nodes). FSDP1 calls them
intra- and inter-node groups, FSDP2 finds them in its mesh info, DDP has one, labelled
``"replicate"``. Every unit of a model must agree, otherwise a label would stand for two groups
and a recovery could replace one and silently leave the other.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel

from accelpact.rebind.errors import RebindError

__all__ = ["data_plane_groups"]


def data_plane_groups(model: nn.Module) -> dict[str, ProcessGroup]:
    """``{"shard": …, "replicate": …}`` (the labels present) for FSDP1, FSDP2 or DDP models.

    Raises ``RebindError`` when the model uses none of them, or when two units disagree on the
    group behind one label.
    """
    found: dict[str, ProcessGroup] = {}
    where: dict[str, str] = {}

    def record(label: str, group: Any, path: str) -> None:
        if not isinstance(group, ProcessGroup):
            return
        previous = found.setdefault(label, group)
        where.setdefault(label, path)
        if previous is not group:
            raise RebindError(f"units disagree on the {label!r} group: {where[label] or '<root>'} uses "
                              f"{previous.group_name!r}, {path or '<root>'} uses {group.group_name!r}")

    for path, module in model.named_modules():
        if isinstance(module, FullyShardedDataParallel):
            record("shard", module.__dict__.get("process_group"), path)
            record("replicate", module.__dict__.get("_inter_node_pg"), path)
        elif isinstance(module, DistributedDataParallel):
            record("replicate", module.__dict__.get("process_group"), path)
        else:
            _record_fsdp2(module, path, record)
    if not found:
        raise RebindError(f"{type(model).__qualname__} is not wrapped by FSDP1, FSDP2 or DDP: no data-plane group")
    return found


def _record_fsdp2(module: nn.Module, path: str, record: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return
    param_groups = module._get_fsdp_state()._fsdp_param_groups
    if not param_groups:  # a fully_shard call that manages no parameters
        return
    refuse_per_parameter_meshes(module, param_groups, path)
    param_group = param_groups[0]
    mesh_info = param_group.mesh_info
    record("shard", getattr(mesh_info, "shard_process_group", None), path)
    record("replicate", getattr(mesh_info, "replicate_process_group", None), path)
    refuse_unlabelled_fsdp2_groups(param_group, path)


def refuse_unlabelled_fsdp2_groups(param_group: Any, path: str) -> None:
    """FSDP2 options that put a unit's collectives on a group besides its shard and replicate
    groups: a recovery would replace those two and leave that one as it was, broken by the same
    failure, for the next update to hang or fail on. Refused by name at attach."""
    where = path or "<root>"
    mesh_info = param_group.mesh_info
    if getattr(mesh_info, "reduce_scatter_process_group", None) is not None:
        raise RebindError(f"FSDP2 unit {where} reduce-scatters on a separate group "
                          "(set_separate_reduce_scatter_group): AccelPact replaces only the shard and replicate "
                          "groups; turn it off to attach")
    post = param_group.post_forward_mesh_info
    if post is not None and post is not mesh_info and \
            getattr(post, "shard_process_group", None) is not getattr(mesh_info, "shard_process_group", None):
        raise RebindError(f"FSDP2 unit {where} reshards after forward to a smaller mesh of its own "
                          "(reshard_after_forward=<int>): AccelPact replaces only the shard and replicate groups; "
                          "use reshard_after_forward=True or False to attach")


def refuse_per_parameter_meshes(unit: nn.Module, param_groups: list[Any], path: str) -> None:
    """torch 2.13 gives a unit one param group per mesh its ``shard_placement_fn`` returns (expert
    parameters on their own mesh, say), each on its own groups: one label per unit would stand for
    one of them and a recovery would leave the others broken. Refused by name at attach."""
    if len(param_groups) < 2:
        return
    names = {id(module): name for name, module in unit.named_modules()}

    def described(param_group: Any) -> str:
        params = [".".join(filter(None, (names.get(id(p._module_info.module)), p._module_info.param_name)))
                  for p in param_group.fsdp_params]
        info = param_group.mesh_info
        groups = [f"{label} {group.group_name!r}" for label, group in
                  (("shard", getattr(info, "shard_process_group", None)),
                   ("replicate", getattr(info, "replicate_process_group", None))) if group is not None]
        return f"{params} on the mesh {info.mesh.mesh_dim_names} ({', '.join(groups)})"

    extra = "; ".join(described(group) for group in param_groups[1:])
    raise RebindError(f"FSDP2 unit {path or '<root>'} has {len(param_groups)} param groups (per-parameter meshes "
                      f"from shard_placement_fn): besides {described(param_groups[0])}, {extra}. AccelPact "
                      "replaces one shard and one replicate group per unit; give every parameter of a unit the "
                      "unit's mesh to attach")
