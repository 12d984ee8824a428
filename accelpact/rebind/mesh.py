"""DeviceMesh references: the per-mesh name table and group registry (torch 2.13).

A mesh names its groups (``_dim_group_names``) and resolves them through c10d's registry on every
``get_group``; the root mesh also keeps ``_pg_registry`` (name → group). A replacement group has
a new name (``accelpact:<label>:g<n>``), so both tables must follow: the name entry is rewritten
to the new name (a *name* site) and the registry entry is re-keyed (a *registry* site, which
holds the group object and counts as a reference). Submeshes carry their own name lists and
share the root's registry; every mesh reachable from the model or the extras is handled.

DTensor caches sharding decisions (a Python LRU cache and a C++ fast-path cache) whose outputs
carry the mesh object of the call that filled them, and meshes compare equal by layout, not by
group names: an in-place op on a parameter can swap in a mesh from an earlier, equal mesh (another
model's, say). Those caches cannot be walked, so every rebind that touches a mesh clears them;
from then on DTensor ops only see meshes this plan rewrote.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from accelpact.rebind.rule import RuleContext
from accelpact.rebind.sites import Access, Site

__all__ = ["MeshRule"]


class MeshRule:
    name = "mesh"
    watch = {"mesh": (DeviceMesh,)}

    def apply(self, ctx: RuleContext) -> None:
        for mesh, path in ctx.watched("mesh"):
            touched = False
            names = mesh.__dict__.get("_dim_group_names")
            if isinstance(names, list):
                for index, name in enumerate(names):
                    if name == ctx.target_name:
                        ctx.add(Site(f"{path}._dim_group_names[{index}]", "mesh.dim_group_name", Access.NAME,
                                     names, index))
                        touched = True
            registry = mesh.__dict__.get("_pg_registry")
            if isinstance(registry, dict) and registry.get(ctx.target_name) is ctx.target:
                site = ctx.label(registry, ctx.target_name, "mesh.pg_registry", Access.REGISTRY)
                ctx.expect(site is not None, f"{path}._pg_registry holds the group but the walk did not report it")
                touched = True
            if touched:
                ctx.add_action("dtensor.clear_sharding_caches", clear_dtensor_sharding_caches)


def clear_dtensor_sharding_caches() -> None:
    """Drop DTensor's cached sharding decisions, which may hold meshes naming a retired group."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()


def meshes_of(ctx: RuleContext) -> list[DeviceMesh]:
    """Every mesh the walk reached (the proof re-checks their tables, not only recorded sites)."""
    return [mesh for mesh, _ in ctx.watched("mesh")]
