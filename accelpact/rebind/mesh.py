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
model's, say). Those caches cannot be walked. What they can hand out, though, is only a live mesh
object, and every live one is on the heap: after a rebind that touched a mesh, a heap scan looks
for any DeviceMesh still naming the replaced group or any retired one (those only the caches hold
included). None: every mesh a cached decision carries names live groups, and the caches are kept,
so the first update after a recovery runs hot (dropping them cost it 14x here). One or more: the
caches are dropped, as before, and the next ops only see meshes this plan rewrote.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque

from torch.distributed.device_mesh import DeviceMesh

from accelpact.comm.lifecycle import retired_group_names
from accelpact.rebind.rule import RuleContext
from accelpact.rebind.sites import Access, Site

__all__ = ["MeshRule"]

log = logging.getLogger("accelpact.rebind")


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
                ours = frozenset(id(m) for m, _ in ctx.watched("mesh"))  # rewritten and proven by the plans
                ctx.add_action("dtensor.sharding_caches",
                               lambda replaced, ours=ours: keep_or_drop_sharding_caches(replaced, ours))


#: What the last rebinds did with DTensor's caches: ("kept" | "dropped", stale meshes, scan ms).
CACHE_DECISIONS: deque[tuple[str, int, float]] = deque(maxlen=64)


def keep_or_drop_sharding_caches(replaced: str, ours: frozenset[int] = frozenset()) -> None:
    """Keep DTensor's sharding caches unless a live mesh still names `replaced` or a retired group.
    `ours`: the meshes the plans reach (ids); their tables are rewritten by the plan of each
    replaced group and checked by its proof, so only a mesh outside them can be stale here (a
    2-D mesh still names the other group until that group's plan has run)."""
    start = time.perf_counter()
    stale = [m for m in meshes_naming({replaced, *retired_group_names()}) if id(m) not in ours]
    if stale:
        clear_dtensor_sharding_caches()
        log.info("dropped DTensor's sharding caches: %d live mesh(es) still name a retired group", len(stale))
    CACHE_DECISIONS.append(("dropped" if stale else "kept", len(stale), (time.perf_counter() - start) * 1e3))


def meshes_naming(names: set[str]) -> list[DeviceMesh]:
    """Every live DeviceMesh that names one of `names`. An instance of a Python class refers to
    its class for the collector, so the referrers of the mesh classes are every live mesh, those
    only DTensor's caches hold included (a C-level scan, about half the time of listing every
    object; tests/test_rebind_units.py pins that a mesh the plans do not reach is found)."""
    kinds = _subclasses(DeviceMesh)  # by type: DeviceMesh's metaclass makes isinstance() slow (and warn)
    return [obj for obj in gc.get_referrers(*kinds)
            if type(obj) in kinds and names.intersection(obj.__dict__.get("_dim_group_names") or ())]


def _subclasses(cls: type) -> set[type]:
    found, todo = {cls}, [cls]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def clear_dtensor_sharding_caches() -> None:
    """Drop DTensor's cached sharding decisions, which may hold meshes naming a retired group."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()


def meshes_of(ctx: RuleContext) -> list[DeviceMesh]:
    """Every mesh the walk reached (the proof re-checks their tables, not only recorded sites)."""
    return [mesh for mesh, _ in ctx.watched("mesh")]
