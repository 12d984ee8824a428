"""What a framework rule sees and may do during discovery.

The generic walk finds every Python-visible reference; a rule then (1) names the ones it
understands (``fsdp1.inter_node_pg`` instead of ``generic.item``), (2) adds the sites no walk can
see (DDP's C++ reducer, DeviceMesh name tables), (3) claims the opaque C++ objects it knows how to
rebind, and (4) checks its own model of the framework (each FSDP1 HYBRID_SHARD unit must show
*both* of its inter-node references): a failed check means torch moved and is an error, not a
silently partial plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from accelpact.rebind.errors import UnknownWrapperError
from accelpact.rebind.sites import Access, Site
from accelpact.rebind.walker import WalkResult

__all__ = ["Rule", "RuleContext"]


class RuleContext:
    """The walk's findings for one target group, indexed for rules."""

    def __init__(self, target: Any, walk_result: WalkResult) -> None:
        self.target = target
        self.target_name: str = target.group_name
        self.walk = walk_result
        self.sites: list[Site] = list(walk_result.sites)
        self._by_holder_key = {(id(site.holder), _hashable(site.key)): site for site in self.sites}
        self._claimed_opaque: set[int] = set()
        self.after_rebind: dict[str, Callable[[str], None]] = {}

    def watched(self, key: str) -> list[tuple[Any, str]]:
        return self.walk.watched.get(key, [])

    def site_at(self, holder: Any, key: Any) -> Site | None:
        return self._by_holder_key.get((id(holder), _hashable(key)))

    def label(self, holder: Any, key: Any, kind: str, access: Access | None = None) -> Site | None:
        """Give the walk's site at ``holder[key]`` a rule kind (and optionally a special access)."""
        site = self.site_at(holder, key)
        if site is not None:
            site.kind = kind
            if access is not None:
                site.access = access
        return site

    def add(self, site: Site) -> None:
        self.sites.append(site)
        self._by_holder_key[(id(site.holder), _hashable(site.key))] = site

    def add_action(self, name: str, action: Callable[[str, str], None]) -> None:
        """Something to do after every rebind of this plan, given the replaced group's name and its
        successor's (e.g. drop a cache that may hold stale objects)."""
        self.after_rebind[name] = action

    def claim_opaque(self, obj: Any) -> None:
        self._claimed_opaque.add(id(obj))

    def is_claimed(self, obj: Any) -> bool:
        return id(obj) in self._claimed_opaque

    def expect(self, condition: bool, finding: str) -> None:
        """A rule's model of its framework must hold; otherwise refuse (torch changed)."""
        if not condition:
            raise UnknownWrapperError(self.target_name, [finding])


class Rule(Protocol):
    """One framework's knowledge: the types it wants reported, and what it does with them."""

    name: str
    watch: Mapping[str, tuple[type, ...]]

    def apply(self, ctx: RuleContext) -> None: ...


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return id(key)
    return key if isinstance(key, str | int) else id(key)
