"""Shrink a DeviceMesh and FSDP2's mesh infos in place, for a world with fewer replicas (torch 2.13).

After a shrink (`Config.on_loss="shrink"`) the groups are rebuilt under their old names with
translated members, and the rebind plans point every cached reference at them. What the
references cannot learn from a group is the mesh's *shape*: a DeviceMesh keeps its layout, its
rank map and this rank's coordinates, and every DTensor (parameters, optimizer moments) and
every FSDP2 mesh info holds the mesh object itself. So the mesh is reshaped in place: each
reference keeps its object and sees the smaller world. The new shape comes from torch's own
constructor (a throwaway mesh with no groups), so layout, rank map and coordinates stay
consistent by torch's rules; submeshes (FSDP2 slices one per parameter) get their axes of the
new layout. FSDP2's gradient division reads the group sizes at every reduction; its mesh infos'
cached sizes and ranks are refreshed too. FSDP1 HYBRID_SHARD computes its division factors once,
at wrapping, from the data-parallel world (shard group × inter-node group): every wrapper's
factors, and those of its inter-node hook state, are computed again for the smaller world.
`proof` checks afterwards that every mesh, mesh info and FSDP1 factor says the new world, and
names any that does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

from .errors import RebindError
from .mesh import live_meshes

__all__ = ["ReshapeReport", "shrink_mesh_tensor", "reshape", "proof"]

#: what a DeviceMesh is made of, besides its names and groups (which the rebind handles)
_SHAPE_FIELDS = ("_layout", "_rank_map", "_flatten_rank_map", "_rank", "_coordinate_on_dim")


@dataclass(frozen=True)
class ReshapeReport:
    meshes: int  # root and child meshes reshaped
    mesh_infos: int  # FSDP2 mesh infos refreshed
    fsdp1_factors: int  # FSDP1 HYBRID_SHARD wrappers whose division factors were computed again


def shrink_mesh_tensor(mesh: torch.Tensor, renumber: Mapping[int, int]) -> torch.Tensor:
    """`mesh` without the slices whose ranks leave, every staying rank renumbered. The ranks that
    leave must make up whole slices along one dimension (replica groups); else RebindError."""
    keep = torch.tensor([[int(r) in renumber for r in mesh.flatten().tolist()]]).view(mesh.shape)
    for dim in range(mesh.dim()):
        other = tuple(d for d in range(mesh.dim()) if d != dim)
        whole = keep.all(dim=other) if other else keep
        if torch.equal(whole, keep.any(dim=other) if other else keep):
            kept = whole.nonzero().flatten()
            if kept.numel() == 0:
                break
            smaller = mesh.index_select(dim, kept).contiguous()
            return smaller.clone().apply_(lambda r: renumber[int(r)])
    raise RebindError(f"the ranks that go on ({sorted(renumber)}) are not whole slices of the mesh "
                      f"{mesh.tolist()}: it cannot shrink to them")


def _meshes_of(roots: Iterable[DeviceMesh]) -> tuple[list[DeviceMesh], list[DeviceMesh]]:
    """The root meshes and every live submesh of one of them (FSDP2 makes one per parameter; only
    the tracker of live meshes knows them all: `mesh.live_meshes`)."""
    root_ids = {id(m._root_mesh or m): m._root_mesh or m for m in roots}
    children = [o for o in live_meshes() if o._root_mesh is not None and id(o._root_mesh) in root_ids]
    return list(root_ids.values()), children


def unshrinkable(meshes: Iterable[DeviceMesh]) -> str:
    """Why these meshes (and their live submeshes) cannot shrink in place; empty if they can. A
    flattened submesh (`DeviceMesh._flatten`) names an axis the root does not have: found only
    inside the shrink, the world would already have been rebuilt."""
    roots, children = _meshes_of(meshes)
    for child in children:
        root_names = child._root_mesh._mesh_dim_names
        if root_names is None or child._mesh_dim_names is None:
            return f"a submesh of {root_names} has no dimension names: its axes cannot be found"
        if not set(child._mesh_dim_names) <= set(root_names):
            return (f"the submesh {child._mesh_dim_names} of the mesh {root_names} is flattened (_flatten): it "
                    "cannot shrink in place")
    return ""


def reshape(model: nn.Module, meshes: Iterable[DeviceMesh], renumber: Mapping[int, int],
            new_rank: int) -> ReshapeReport:
    """Shrink every mesh in `meshes` (and their submeshes) to the ranks of `renumber`, in place,
    with this process as `new_rank`; then refresh FSDP2's mesh infos in `model`."""
    roots, children = _meshes_of(meshes)
    for root in roots:
        names = root._mesh_dim_names
        smaller = shrink_mesh_tensor(root.mesh, renumber)
        template = DeviceMesh(root._device_type, smaller, mesh_dim_names=names, _init_backend=False, _rank=new_rank)
        for f in _SHAPE_FIELDS:
            setattr(root, f, getattr(template, f))
        root._hash = None
        for child in (c for c in children if c._root_mesh is root):
            if names is None or child._mesh_dim_names is None:
                raise RebindError(f"a submesh of {names} has no dimension names: cannot find its axes")
            if not set(child._mesh_dim_names) <= set(names):
                raise RebindError(f"the submesh {child._mesh_dim_names} of {names} is flattened: its axes are "
                                  "none of the root's, so it cannot shrink in place")
            child._layout = _MeshLayout(tuple(root._layout[names.index(n)] for n in child._mesh_dim_names))
            child._rank_map, child._flatten_rank_map, child._rank = (root._rank_map, root._flatten_rank_map,
                                                                    new_rank)
            child._coordinate_on_dim = child._compute_coordinate_on_dim()
            child._hash = None
    return ReshapeReport(meshes=len(roots) + len(children), mesh_infos=_refresh_mesh_infos(model),
                         fsdp1_factors=_refresh_fsdp1_factors(model))


def _fsdp1_hybrids(model: nn.Module):
    from torch.distributed.fsdp import FullyShardedDataParallel

    for path, module in model.named_modules():
        if isinstance(module, FullyShardedDataParallel) and getattr(module, "_inter_node_pg", None) is not None:
            yield path or "<root>", module


def _fsdp1_factors(data_parallel: int) -> tuple[float, float]:
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    pre = DefaultState._get_gradient_predivide_factor(data_parallel)
    return pre, data_parallel / pre


def _refresh_fsdp1_factors(model: nn.Module) -> int:
    """FSDP1 HYBRID_SHARD divides by factors of the data-parallel world fixed at wrapping."""
    count = 0
    for _, fsdp in _fsdp1_hybrids(model):
        inter = fsdp._inter_node_pg.size()
        fsdp._gradient_predivide_factor, fsdp._gradient_postdivide_factor = _fsdp1_factors(fsdp.world_size * inter)
        hook_state = getattr(fsdp, "_inter_node_state", None)
        if hook_state is not None:
            hook_state.world_size = inter
            hook_state.gradient_predivide_factor, hook_state.gradient_postdivide_factor = _fsdp1_factors(inter)
        count += 1
    return count


def _mesh_infos(model: nn.Module):
    from torch.distributed.fsdp import FSDPModule

    for path, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:  # one per mesh (shard_placement_fn)
            for info in (group.mesh_info, group.post_forward_mesh_info):
                if info is not None:
                    yield path or "<root>", info


def _refresh_mesh_infos(model: nn.Module) -> int:
    """FSDP2 caches sizes and ranks of its mesh dims at `fully_shard`; they follow the mesh."""
    seen: set[int] = set()
    for _, info in _mesh_infos(model):
        if id(info) in seen:
            continue
        seen.add(id(info))
        for dim, size, rank, group in (("shard_mesh_dim", "shard_mesh_size", "shard_mesh_rank", "shard_process_group"),
                                       ("replicate_mesh_dim", "replicate_mesh_size", "replicate_mesh_rank",
                                        "replicate_process_group")):
            if getattr(info, dim, None) is not None and hasattr(info, size):
                setattr(info, size, info.mesh.size(getattr(info, dim)))
                setattr(info, rank, getattr(info, group).rank())
    return len(seen)


def proof(model: nn.Module, meshes: Iterable[DeviceMesh], world_size: int, rank: int) -> None:
    """Every reshaped mesh spans at most `world_size` ranks and places `rank`; every FSDP2 mesh
    info's cached sizes match its mesh and groups. RebindError names each that does not."""
    roots, children = _meshes_of(meshes)
    wrong = [f"a mesh of {m.mesh.tolist()} (dims {m._mesh_dim_names}) still spans {m._layout.numel()} ranks or "
             f"does not place rank {rank}" for m in (*roots, *children)
             if m._layout.numel() > world_size or m._rank != rank or m._coordinate_on_dim is None]
    for path, info in _mesh_infos(model):
        for dim, size, group in (("shard_mesh_dim", "shard_mesh_size", "shard_process_group"),
                                 ("replicate_mesh_dim", "replicate_mesh_size", "replicate_process_group")):
            if getattr(info, dim, None) is None or not hasattr(info, size):
                continue
            cached, mesh_size, group_size = getattr(info, size), info.mesh.size(getattr(info, dim)), getattr(info,
                                                                                                          group).size()
            if not cached == mesh_size == group_size:
                wrong.append(f"{path}: {size}={cached}, its mesh says {mesh_size}, its group has {group_size}")
    for path, fsdp in _fsdp1_hybrids(model):
        expected = _fsdp1_factors(fsdp.process_group.size() * fsdp._inter_node_pg.size())
        if (fsdp._gradient_predivide_factor, fsdp._gradient_postdivide_factor) != expected:
            wrong.append(f"{path}: FSDP1 divides by {fsdp._gradient_predivide_factor} and "
                         f"{fsdp._gradient_postdivide_factor}, the world now needs {expected}")
    if wrong:
        raise RebindError("after the shrink: " + "; ".join(wrong))
