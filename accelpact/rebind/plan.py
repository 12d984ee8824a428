"""A rebind plan: the sites of one group, rewritten many times, proven after every rewrite.

``discover`` builds the plan once (slow: an object-graph walk). ``rebind`` is the hot path of a
recovery: it checks membership first (nothing is written to a plan that would change who talks
to whom), then stores the new group into precomputed containers. ``prove`` re-reads exactly those
sites and the mesh tables; ``verify_deep`` re-walks everything (tests, diagnostics). The plan
follows its group: after ``rebind(g1)`` it is the plan of ``g1``, ready for ``rebind(g2)``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch._C._distributed_c10d import ProcessGroup

from accelpact.comm import _c10d
from accelpact.comm.naming import group_identity
from accelpact.comm.reaper import free_later
from accelpact.rebind.errors import MembershipMismatchError, StaleReferenceError
from accelpact.rebind.sites import Access, Site, slot_descriptor

__all__ = ["DeepCheck", "ProofResult", "RebindPlan", "RebindResult"]


@dataclass(frozen=True)
class RebindResult:
    """What one ``rebind`` did. ``references``: sites holding the group object (including DDP's
    reducer and mesh registries); ``names``: name-table sites; ``total`` = both. ``elapsed_us``
    covers the writes and the after-rebind ``actions`` (DTensor's caches kept or dropped), ``actions_us`` the
    latter alone: it grows with what DTensor cached since the last rebind (≈0.5 ms after a few
    FSDP2 steps), the writes do not."""

    old_name: str
    new_name: str
    counts: dict[str, int]
    references: int
    names: int
    total: int
    elapsed_us: float
    skipped: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    actions_us: float = 0.0


@dataclass(frozen=True)
class ProofResult:
    group_name: str
    checked: int
    elapsed_us: float


@dataclass(frozen=True)
class DeepCheck:
    """Result of a full re-walk: every path that holds the current group, and any the plan lacks."""

    group_name: str
    found: tuple[str, ...]
    unrecorded: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.unrecorded


class RebindPlan:
    """Every site that holds one process group, found once, rewritable and provable many times."""

    def __init__(
        self,
        group: ProcessGroup,
        ranks: Sequence[int],
        sites: Sequence[Site],
        *,
        meshes: Sequence[Any] = (),
        roots: Sequence[tuple[str, Any]] = (),
        discover_us: float = 0.0,
        visited: int = 0,
        after_rebind: Mapping[str, Callable[[str, str], None]] | None = None,
    ) -> None:
        self._group = group
        self._name: str = group.group_name
        self._previous: ProcessGroup | None = None
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.sites: tuple[Site, ...] = tuple(sites)
        self.meshes: tuple[Any, ...] = tuple(meshes)
        self.roots: tuple[tuple[str, Any], ...] = tuple(roots)
        self.discover_us = discover_us
        self.visited = visited
        self.after_rebind: dict[str, Callable[[str, str], None]] = dict(after_rebind or {})
        self._actions = tuple(self.after_rebind.values())
        self.counts: dict[str, int] = dict(collections.Counter(site.kind for site in self.sites))
        self.names = sum(1 for site in self.sites if site.holds_name)
        self.references = len(self.sites) - self.names
        self._compile()

    # ---------------------------------------------------------------------------- properties

    @property
    def group(self) -> ProcessGroup:
        """The group the sites hold now."""
        return self._group

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def previous_group(self) -> ProcessGroup | None:
        return self._previous

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(site.path for site in self.sites)

    def paths_of(self, kind: str) -> list[str]:
        return [site.path for site in self.sites if site.kind == kind]

    def __len__(self) -> int:
        return len(self.sites)

    def __repr__(self) -> str:
        return (f"RebindPlan({self._name!r}, ranks={list(self.ranks)}, references={self.references}, "
                f"names={self.names}, kinds={self.counts})")

    # ---------------------------------------------------------------------------- hot path

    def _compile(self) -> None:
        """Split sites by how they are written, so that rebind and prove are tight loops."""
        self._items = [(site.holder, site.key) for site in self.sites if site.access is Access.ITEM]
        self._item_paths = [site.path for site in self.sites if site.access is Access.ITEM]
        self._slots = [(slot_descriptor(site.holder, site.key), site.holder)
                       for site in self.sites if site.access is Access.SLOT]
        self._slot_paths = [site.path for site in self.sites if site.access is Access.SLOT]
        self._names = [(site.holder, site.key) for site in self.sites if site.access is Access.NAME]
        self._name_paths = [site.path for site in self.sites if site.access is Access.NAME]
        self._others = [site for site in self.sites
                        if site.access not in (Access.ITEM, Access.SLOT, Access.NAME)]
        self._members = [site for site in self.sites if site.access in (Access.DICT_KEY, Access.SET_MEMBER)]
        self._name_tables = _distinct_holders(self.sites, Access.NAME)
        self._registries = _distinct_holders(self.sites, Access.REGISTRY)

    def check_membership(self, new_group: ProcessGroup) -> None:
        """Raise ``MembershipMismatchError`` unless ``new_group`` has exactly the plan's members."""
        if not isinstance(new_group, ProcessGroup):
            raise TypeError(f"rebind needs a ProcessGroup, got {type(new_group).__qualname__}")
        ranks = _c10d.registered_ranks(new_group)
        if ranks is None or tuple(ranks) != self.ranks:
            raise MembershipMismatchError(self.ranks, ranks, f"{self._name!r} → {new_group.group_name!r}")

    def rebind(self, new_group: ProcessGroup, *, skip: Collection[str] = ()) -> RebindResult:
        """Point every site at ``new_group``; nothing is written unless the membership matches.

        ``skip`` leaves the named paths untouched: a fault-injection knob to test that ``prove``
        catches a missed site, never for production use.
        """
        self.check_membership(new_group)
        old, old_name, new_name = self._group, self._name, new_group.group_name
        start = time.perf_counter_ns()
        if skip:
            self._rebind_slowly(old, new_group, old_name, new_name, frozenset(skip))
        else:
            # writes that call into frameworks or rebuild containers (the only ones that can fail)
            # go first, so a failure leaves the plain stores undone and prove() names the mess
            for site in self._others:
                site.write(old, new_group, old_name, new_name)
            for holder, key in self._items:
                holder[key] = new_group
            for descriptor, holder in self._slots:
                descriptor.__set__(holder, new_group)
            for holder, key in self._names:
                holder[key] = new_name
        writes_done = time.perf_counter_ns()
        for action in self._actions:
            action(old_name, new_name)
        end = time.perf_counter_ns()
        elapsed_us, actions_us = (end - start) / 1e3, (end - writes_done) / 1e3
        if new_group is not old:
            # the group before last is dropped here; freeing it joins its backend's threads
            # (milliseconds), so that happens on the reaper's thread, off the recovery's path
            free_later(self._previous)
            self._previous = old
        self._group, self._name = new_group, new_name
        return RebindResult(old_name, new_name, self.counts, self.references, self.names, len(self.sites),
                            elapsed_us, tuple(sorted(skip)), tuple(self.after_rebind), actions_us)

    def _rebind_slowly(self, old: Any, new: Any, old_name: str, new_name: str, skip: frozenset[str]) -> None:
        unknown = skip - set(self.paths)
        if unknown:
            raise KeyError(f"cannot skip paths the plan does not have: {sorted(unknown)}")
        for site in self.sites:
            if site.path not in skip:
                site.write(old, new, old_name, new_name)

    def prove(self, old_group: ProcessGroup | None = None) -> ProofResult:
        """Re-read every recorded site and every mesh table: all must name the current group.

        Raises ``StaleReferenceError`` listing each path that still holds ``old_group`` (default:
        the group replaced by the last rebind) or does not hold the current group.
        """
        start = time.perf_counter_ns()
        current, name = self._group, self._name
        stale: list[str] = []
        for (holder, key), path in zip(self._items, self._item_paths):
            try:
                if holder[key] is not current:
                    stale.append(path)
            except (KeyError, IndexError):
                stale.append(path)
        for (descriptor, holder), path in zip(self._slots, self._slot_paths):
            if descriptor.__get__(holder) is not current:
                stale.append(path)
        for (holder, key), path in zip(self._names, self._name_paths):
            if holder[key] != name:
                stale.append(path)
        for site in self._others:
            if not site.holds(current, name):
                stale.append(site.path)
        old = old_group if old_group is not None else self._previous
        if old is not None and old is not current:
            # a key or set member holds the current group even when the retired one is back beside it
            stale.extend(f"{site.path} still holds the retired group too" for site in self._members
                         if any(member is old for member in site.holder))
            stale.extend(self._stale_in_tables(old, old.group_name))
        if _c10d.resolve_name(name) is not current:
            stale.append(f"c10d name registry [{name}] does not resolve to the current group")
        elapsed_us = (time.perf_counter_ns() - start) / 1e3
        if stale:
            raise StaleReferenceError(group_identity(current), stale, None if old is None else group_identity(old))
        return ProofResult(name, len(self.sites), elapsed_us)

    def _stale_in_tables(self, old: Any, old_name: str) -> list[str]:
        """Whole mesh tables, not only the recorded entries: no other entry may name the old group.

        A successor keeps its predecessor's name (`comm.naming`), and a rebuilt world re-creates a
        group under the name the script gave it (`membership.world`): the name then resolves to
        the new group (checked in `prove`), so only the old *object* is stale there."""
        renamed = old_name != self._name
        stale = [f"{path} (a mesh name table) still names {old_name!r}"
                 for table, path in self._name_tables if renamed and old_name in table]
        stale += [f"{path} (a mesh registry) still holds {old_name!r}"
                  for registry, path in self._registries
                  if (renamed and old_name in registry) or any(group is old for group in registry.values())]
        return stale

    # ---------------------------------------------------------------------------- slow checks

    def verify_deep(self, old_group: ProcessGroup | None = None) -> DeepCheck:
        """Re-walk everything from the discovery roots (slow; tests and diagnostics).

        Raises ``StaleReferenceError`` if ``old_group`` (default: the last replaced group), or its
        name in a mesh when the successor did not keep it, is reachable anywhere; returns the current group's sites and any the plan
        does not know (``DeepCheck.complete``).
        """
        from accelpact.rebind.discovery import walk_for  # late: discovery imports this module

        old = old_group if old_group is not None else self._previous
        if old is not None and old is not self._group:
            old_ctx = walk_for(self.roots, old)
            # a name the successor kept names the current group (its resolution is proven in `prove`)
            kept = old.group_name == self._name
            stale = [site.path for site in old_ctx.sites if not (kept and site.access is Access.NAME)]
            if stale:
                raise StaleReferenceError(group_identity(self._group), stale, group_identity(old))
        ctx = walk_for(self.roots, self._group)
        recorded = {(id(site.holder), _key_identity(site)) for site in self.sites}
        found = tuple(site.path for site in ctx.sites)
        unrecorded = tuple(site.path for site in ctx.sites
                           if (id(site.holder), _key_identity(site)) not in recorded)
        return DeepCheck(self._name, found, unrecorded)


def _distinct_holders(sites: Sequence[Site], access: Access) -> list[tuple[Any, str]]:
    holders: dict[int, tuple[Any, str]] = {}
    for site in sites:
        if site.access is access:
            holders.setdefault(id(site.holder), (site.holder, site.path.rsplit("[", 1)[0]))
    return list(holders.values())


def _key_identity(site: Site) -> Any:
    if site.access is Access.REGISTRY:
        return "<registry>"
    return site.key if isinstance(site.key, str | int) else id(site.key)
