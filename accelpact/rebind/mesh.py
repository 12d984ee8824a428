"""DeviceMesh references: the per-mesh name table and group registry (torch 2.13).

A mesh names its groups (``_dim_group_names``) and resolves them through c10d's registry on every
``get_group``; the root mesh also keeps ``_pg_registry`` (name → group). A replacement keeps its
predecessor's name (`comm.naming`), so the name entry (a *name* site) already names the
successor and is only proven to; the registry entry (a *registry* site, which holds the group
object and counts as a reference) is rewritten. A plan rebound to a group under another name
(by hand) rewrites the name entry too. Submeshes carry their own name lists and
share the root's registry; every mesh reachable from the model or the extras is handled.

DTensor caches sharding decisions (a Python LRU cache and a C++ fast-path cache) whose outputs
carry the mesh object of the call that filled them, and meshes compare equal by layout, not by
group names: an in-place op on a parameter can swap in a mesh from an earlier, equal mesh (another
model's, say). Those caches cannot be walked. What they can hand out, though, is only a live mesh
object, and every live one is known: after a rebind that touched a mesh, every live DeviceMesh is
looked at for one naming a group c10d no longer resolves (those only the caches hold included).
None: every mesh a cached decision carries names live groups, and the caches are kept, so the
first update after a recovery runs hot (dropping them cost it 14x here). One or more: the
caches are dropped, as before, and the next ops only see meshes this plan rewrote.

Which meshes are live: a scan of the heap found them, at 33-76 ms per rebind for a tiny FSDP2 job
(300,000 objects): most of a recovery's rebind phase, paid once per rebuilt group. So the meshes
are tracked as they are made instead (`live_meshes`): DeviceMesh's ``__init__`` and
``__setstate__`` (copies and unpickling) are wrapped once to remember each new mesh weakly, and
one heap scan at that moment finds those made before. `tests/test_rebind_units.py` pins that a
copied mesh the plans do not reach is found, and that the tracker sees what a heap scan sees.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterator

from torch.distributed.device_mesh import DeviceMesh

from accelpact.comm import _c10d
from accelpact.rebind.rule import RuleContext
from accelpact.rebind.sites import Access, Site

__all__ = ["MeshRule", "one_cache_decision"]

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
                live_meshes()  # start tracking meshes now, at discovery, not in the first recovery
                ours = frozenset(id(m) for m, _ in ctx.watched("mesh"))  # rewritten and proven by the plans
                ctx.add_action("dtensor.sharding_caches",
                               lambda replaced, successor, ours=ours: keep_or_drop_sharding_caches(
                                   replaced, ours, successor=successor))


#: What the last rebinds did with DTensor's caches: ("kept" | "dropped", stale meshes, scan ms).
CACHE_DECISIONS: deque[tuple[str, int, float]] = deque(maxlen=64)
#: How many meshes outside the plans each rebind pointed at the successor (`follow_successor`).
FOLLOWED: deque[int] = deque(maxlen=64)


def keep_or_drop_sharding_caches(replaced: str, ours: frozenset[int] = frozenset(), *,
                                 successor: str | None = None) -> None:
    """Keep DTensor's sharding caches unless a live mesh still names `replaced` or a retired group.
    `ours`: the meshes the plans reach (ids); their tables are rewritten by the plan of each
    replaced group and checked by its proof, so only a mesh outside them can be stale here. A
    live mesh outside them that names `replaced` is first pointed at `successor`
    (`follow_successor`). Inside `one_cache_decision` the decision waits for the last plan."""
    if successor is not None:
        FOLLOWED.append(follow_successor(replaced, successor, ours))
    if _BATCH is not None:
        _BATCH.append((replaced, successor, ours))
        return
    _decide([(replaced, successor, ours)])


@contextlib.contextmanager
def one_cache_decision() -> Iterator[None]:
    """Rebind several groups, then decide about DTensor's caches once. Deciding after each plan,
    a mesh outside the plans that names a group whose plan had not run yet (the user's
    ``mesh["shard"]`` while ``replicate`` is rebound: a Rewind replaces every group) counted as
    stale, and the caches were dropped: the first update after the recovery ran cold (14x)."""
    global _BATCH
    if _BATCH is not None:  # nested: the outer one decides
        yield
        return
    _BATCH = []
    try:
        yield
    finally:
        batch, _BATCH = _BATCH, None
        if batch:
            _decide(batch)


#: (replaced, successor, ours) of each plan rebound inside `one_cache_decision`; None outside it
_BATCH: list[tuple[str, str | None, frozenset[int]]] | None = None


def _decide(batch: list[tuple[str, str | None, frozenset[int]]]) -> None:
    """Drop the caches if a live mesh outside the plans names a group that no longer is: one whose
    name c10d no longer resolves. A successor keeps its predecessor's name (`comm.naming`) and a
    world rebuilt around a spare re-creates every group under its name, so a mesh naming either
    resolves to the live group, and a cached decision that carries it is still right. Only a
    group replaced under a new name (a plan rebound by hand) or retired without a successor
    (another model's) leaves a mesh naming what is gone."""
    start = time.perf_counter()
    ours = frozenset().union(*(o for _, _, o in batch))
    stale = len(_stale_meshes(ours))
    if stale:  # garbage not yet collected (a model of an earlier world, in a cycle) is no reason
        gc.collect()  # paid only here, where the caches would otherwise go: found in CI, 4 such meshes
        stale = len(_stale_meshes(ours))
    if stale:
        clear_dtensor_sharding_caches()
        log.info("dropped DTensor's sharding caches: %d live mesh(es) still name a retired group", stale)
    CACHE_DECISIONS.append(("dropped" if stale else "kept", stale, (time.perf_counter() - start) * 1e3))


def _stale_meshes(ours: frozenset[int]) -> list[DeviceMesh]:
    return [m for m in live_meshes() if id(m) not in ours and names_a_gone_group(m)]


def names_a_gone_group(mesh: DeviceMesh) -> bool:
    """Whether `mesh` names a group c10d no longer resolves (destroyed, aborted, or renamed away)."""
    return any(_c10d.resolve_name(name) is None for name in mesh.__dict__.get("_dim_group_names") or ())


def follow_successor(replaced: str, successor: str, ours: frozenset[int]) -> int:
    """Point every live mesh the plans do not reach (a submesh sliced after discovery, a mesh the
    user's script keeps for its own collectives) from `replaced` to `successor`, the group that
    replaced it over the same ranks: in its name table and, on a root, in its registry. Without
    this such a mesh kept naming a group c10d no longer resolves, and its first `get_group()`
    after a proven recovery failed. Returns how many meshes it rewrote."""
    followed = 0
    live = _c10d.resolve_name(successor)
    for mesh in meshes_naming({replaced}):
        if id(mesh) in ours:
            continue
        names = mesh.__dict__["_dim_group_names"]
        registry = mesh.__dict__.get("_pg_registry")
        held = registry.get(replaced) if isinstance(registry, dict) else None
        if replaced == successor and (held is None or held is live):
            continue  # the successor kept the name, and the registry (if any) holds it already
        names[:] = [successor if name == replaced else name for name in names]
        if isinstance(registry, dict) and replaced in registry:
            del registry[replaced]
            registry[successor] = live
        followed += 1
    if followed:
        log.info("pointed %d live mesh(es) outside the plan from %s to %s", followed, replaced, successor)
    return followed


def meshes_naming(names: set[str]) -> list[DeviceMesh]:
    """Every live DeviceMesh that names one of `names` (those only DTensor's caches hold too)."""
    return [obj for obj in live_meshes() if names.intersection(obj.__dict__.get("_dim_group_names") or ())]


#: id -> every live DeviceMesh since `live_meshes` first ran (weakly: a mesh dies as before). By id:
#: meshes compare and hash by layout, so a set would keep one of two equal meshes.
_LIVE: weakref.WeakValueDictionary[int, DeviceMesh] | None = None


def live_meshes() -> list[DeviceMesh]:
    """Every live DeviceMesh. The first call wraps the constructor and ``__setstate__`` to record
    each new mesh and finds the existing ones with one heap scan: an instance of a Python class
    refers to its class for the collector, so the referrers of the mesh classes are every live
    mesh (a C-level scan, about half the time of listing every object)."""
    global _LIVE
    if _LIVE is None:
        live: weakref.WeakValueDictionary[int, DeviceMesh] = weakref.WeakValueDictionary()
        _record_new_meshes(live)
        kinds = _subclasses(DeviceMesh)  # by type: DeviceMesh's metaclass makes isinstance() slow (and warn)
        for obj in gc.get_referrers(*kinds):
            if type(obj) in kinds:
                live[id(obj)] = obj
        _LIVE = live
    return list(_LIVE.values())


def _record_new_meshes(live: weakref.WeakValueDictionary) -> None:
    init, setstate = DeviceMesh.__init__, DeviceMesh.__setstate__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):  # noqa: N807 - replaces DeviceMesh's own
        init(self, *args, **kwargs)
        live[id(self)] = self

    @functools.wraps(setstate)
    def __setstate__(self, state):  # noqa: N807
        setstate(self, state)
        live[id(self)] = self

    DeviceMesh.__init__, DeviceMesh.__setstate__ = __init__, __setstate__


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
