"""FSDP2 (``fully_shard``) references on a DeviceMesh (torch 2.13).

Each ``fully_shard`` call makes one ``FSDPParamGroup`` whose ``mesh_info`` (an ``HSDPMeshInfo``
for a 2-D mesh, shared with its ``FSDPParam``s) caches ``replicate_process_group`` and
``shard_process_group``: L+1 references per group for L blocks + root. With
``reshard_after_forward=True`` the ``post_forward_mesh_info`` is the same object. A
post-forward mesh of its own (``reshard_after_forward=int``) and a dedicated
``reduce_scatter_process_group`` put collectives on groups besides shard and replicate, which a
recovery would not replace: attach refuses them (`groups.refuse_unlabelled_fsdp2_groups`).

The mesh itself matters as much: parameters are DTensors on the mesh, and anything that asks
``mesh.get_group(dim)`` resolves ``mesh._dim_group_names[dim]`` through c10d's name registry
(``mesh._pg_registry`` holds the groups by name as well). Rebinding only the mesh infos trains,
but the next reduction over the mesh fails. The ``mesh`` rule rewrites those tables.
"""

from __future__ import annotations

from torch.distributed.fsdp._fully_shard._fsdp_common import DataParallelMeshInfo
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from accelpact.rebind.rule import RuleContext

__all__ = ["FSDP2Rule"]

_MESH_INFO_ATTRIBUTES = {
    "replicate_process_group": "fsdp2.replicate_process_group",
    "shard_process_group": "fsdp2.shard_process_group",
    "reduce_scatter_process_group": "fsdp2.reduce_scatter_process_group",
}


class FSDP2Rule:
    name = "fsdp2"
    watch = {"fsdp2.param_group": (FSDPParamGroup,), "fsdp2.mesh_info": (DataParallelMeshInfo,)}

    def apply(self, ctx: RuleContext) -> None:
        for mesh_info, path in ctx.watched("fsdp2.mesh_info"):
            attributes = mesh_info.__dict__
            for attribute, kind in _MESH_INFO_ATTRIBUTES.items():
                if attributes.get(attribute) is ctx.target:
                    ctx.expect(
                        ctx.label(attributes, attribute, kind) is not None,
                        f"{path}.{attribute} holds the group but the walk did not report it",
                    )
        for param_group, path in ctx.watched("fsdp2.param_group"):
            for attribute in ("mesh_info", "post_forward_mesh_info"):
                mesh_info = getattr(param_group, attribute, None)
                if mesh_info is None:
                    continue
                ctx.expect(
                    isinstance(mesh_info, DataParallelMeshInfo),
                    f"{path}.{attribute} is a {type(mesh_info).__qualname__}, not a mesh info (FSDP2 changed?)",
                )
