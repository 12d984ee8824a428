"""DeviceMesh references: the per-mesh name table and group registry (torch 2.13).

A mesh names its groups (``_dim_group_names``) and resolves them through c10d's registry on every
``get_group``; the root mesh also keeps ``_pg_registry`` (name → group). A replacement group has
a new name (``accelpact:<label>:g<n>``), so both tables must follow: the name entry is rewritten
to the new name (a *name* site) and the registry entry is re-keyed (a *registry* site, which
holds the group object and counts as a reference). Submeshes carry their own name lists and
share the root's registry; every mesh reachable from the model or the extras is handled.
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
            names = mesh.__dict__.get("_dim_group_names")
            if isinstance(names, list):
                for index, name in enumerate(names):
                    if name == ctx.target_name:
                        ctx.add(Site(f"{path}._dim_group_names[{index}]", "mesh.dim_group_name", Access.NAME,
                                     names, index))
            registry = mesh.__dict__.get("_pg_registry")
            if isinstance(registry, dict) and registry.get(ctx.target_name) is ctx.target:
                site = ctx.label(registry, ctx.target_name, "mesh.pg_registry", Access.REGISTRY)
                ctx.expect(site is not None, f"{path}._pg_registry holds the group but the walk did not report it")


def meshes_of(ctx: RuleContext) -> list[DeviceMesh]:
    """Every mesh the walk reached (the proof re-checks their tables, not only recorded sites)."""
    return [mesh for mesh, _ in ctx.watched("mesh")]
