"""A site is one place that holds a process group (or its registered name) and how to rewrite it.

Sites are found once (``discover``) and rewritten many times (one ``rebind`` per fault), so each
keeps the exact container and key to write to: rebinding is then a handful of dict/list stores,
without attribute lookups, ``nn.Module.__setattr__`` or another walk.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

__all__ = ["Access", "Site", "UNWRITABLE", "slot_descriptor"]


class Access(enum.Enum):
    """How a site holds the group, which fixes how it is read and rewritten."""

    ITEM = "item"  # holder[key] is the group; holder is a dict (incl. an object's __dict__), list or deque
    DICT_KEY = "dict_key"  # the group is a key of the dict holder
    KEYED_ITEM = "keyed_item"  # holder[group] is the group: moved with its key by the DICT_KEY write
    SET_MEMBER = "set_member"  # the group is a member of the set holder
    CELL = "cell"  # closure cell
    SLOT = "slot"  # __slots__ attribute ``key`` of holder
    PARTIAL_ARG = "partial_arg"  # functools.partial positional argument ``key``
    PARTIAL_KEYWORD = "partial_keyword"  # functools.partial keyword argument ``key``
    DEFAULT = "default"  # function default argument number ``key``
    NAME = "name"  # holder[key] is the group's registered *name* (DeviceMesh name tables)
    REGISTRY = "registry"  # holder maps the group's name to the group (DeviceMesh._pg_registry)
    CALL = "call"  # rewritten by a framework call (DDP's C++ reducer); read back from a record
    # not writable in place: found by the generic walk, reported, never silently skipped
    TUPLE_ITEM = "tuple_item"
    FROZEN_MEMBER = "frozen_member"
    METHOD_SELF = "method_self"


UNWRITABLE = frozenset({Access.TUPLE_ITEM, Access.FROZEN_MEMBER, Access.METHOD_SELF})


class Site:
    """One holder of the group: ``path`` for people, ``holder``/``key`` for the writer.

    ``kind`` names the rule that understood the site (``fsdp1.inter_node_pg``, …) or
    ``generic.<access>`` for references only the generic walk knows about.
    """

    __slots__ = ("path", "kind", "access", "holder", "key", "call", "bound")

    def __init__(
        self,
        path: str,
        kind: str,
        access: Access,
        holder: Any,
        key: Any = None,
        call: Callable[[Any], None] | None = None,
        bound: Any = None,
    ) -> None:
        self.path = path
        self.kind = kind
        self.access = access
        self.holder = holder
        self.key = key
        self.call = call  # CALL sites: the framework call that rebinds
        self.bound = bound  # CALL sites: the group the last call bound (the C++ side has no getter)

    @property
    def writable(self) -> bool:
        return self.access not in UNWRITABLE

    @property
    def holds_name(self) -> bool:
        return self.access is Access.NAME

    def holds(self, group: Any, name: str) -> bool:
        """Whether the site currently holds ``group`` (or ``name``, for name sites)."""
        return _HOLDS[self.access](self, group, name)

    def write(self, old: Any, new: Any, old_name: str, new_name: str) -> None:
        _WRITE[self.access](self, old, new, old_name, new_name)

    def __repr__(self) -> str:
        return f"Site({self.path!r}, {self.kind}, {self.access.value})"


def _setstate_partial(partial: Any, args: tuple[Any, ...], keywords: dict[str, Any]) -> None:
    partial.__setstate__((partial.func, args, keywords, partial.__dict__ or None))


def slot_descriptor(holder: Any, name: str) -> Any:
    for cls in type(holder).__mro__:
        descriptor = cls.__dict__.get(name)
        if descriptor is not None and hasattr(descriptor, "__set__"):
            return descriptor
    raise AttributeError(f"no writable slot {name!r} on {type(holder).__qualname__}")


def _write_partial_arg(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    args = list(site.holder.args)
    args[site.key] = new
    _setstate_partial(site.holder, tuple(args), dict(site.holder.keywords))


def _write_partial_keyword(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    keywords = dict(site.holder.keywords)
    keywords[site.key] = new
    _setstate_partial(site.holder, site.holder.args, keywords)


def _write_default(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    defaults = list(site.holder.__defaults__)
    defaults[site.key] = new
    site.holder.__defaults__ = tuple(defaults)


def _write_dict_key(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    """Re-key the entry; a value that is the group too ({g: g}) becomes the new group with it."""
    value = site.holder.pop(old)
    site.holder[new] = new if value is old else value
    site.key = new


def _write_keyed_item(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    """The value under the group's own key: written by the entry's DICT_KEY site (an item write
    ``holder[old] = new`` would put the retired key back); this site only follows the key."""
    site.key = new


def _write_set_member(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.holder.discard(old)
    site.holder.add(new)


def _write_registry(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.holder.pop(old_name, None)
    site.holder[new_name] = new
    site.key = new_name


def _write_call(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.call(new)
    site.bound = new


def _write_cell(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.holder.cell_contents = new


def _refuse(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    raise TypeError(f"site {site.path} ({site.access.value}) cannot be rewritten in place")


def _write_item(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.holder[site.key] = new


def _write_name(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    site.holder[site.key] = new_name


def _write_slot(site: Site, old: Any, new: Any, old_name: str, new_name: str) -> None:
    slot_descriptor(site.holder, site.key).__set__(site.holder, new)


_WRITE: dict[Access, Callable[[Site, Any, Any, str, str], None]] = {
    Access.ITEM: _write_item,
    Access.NAME: _write_name,
    Access.DICT_KEY: _write_dict_key,
    Access.KEYED_ITEM: _write_keyed_item,
    Access.SET_MEMBER: _write_set_member,
    Access.CELL: _write_cell,
    Access.SLOT: _write_slot,
    Access.PARTIAL_ARG: _write_partial_arg,
    Access.PARTIAL_KEYWORD: _write_partial_keyword,
    Access.DEFAULT: _write_default,
    Access.REGISTRY: _write_registry,
    Access.CALL: _write_call,
    Access.TUPLE_ITEM: _refuse,
    Access.FROZEN_MEMBER: _refuse,
    Access.METHOD_SELF: _refuse,
}


def _holds_item(site: Site, group: Any, name: str) -> bool:
    try:
        return site.holder[site.key] is group
    except (KeyError, IndexError):
        return False


def _holds_name(site: Site, group: Any, name: str) -> bool:
    try:
        return site.holder[site.key] == name
    except (KeyError, IndexError):
        return False


def _holds_member(site: Site, group: Any, name: str) -> bool:
    return any(member is group for member in site.holder)


def _holds_registry(site: Site, group: Any, name: str) -> bool:
    return site.holder.get(name) is group


_HOLDS: dict[Access, Callable[[Site, Any, str], bool]] = {
    Access.ITEM: _holds_item,
    Access.NAME: _holds_name,
    Access.DICT_KEY: _holds_member,
    Access.KEYED_ITEM: lambda site, group, name: site.holder.get(group) is group,
    Access.SET_MEMBER: _holds_member,
    Access.FROZEN_MEMBER: _holds_member,
    Access.CELL: lambda site, group, name: site.holder.cell_contents is group,
    Access.SLOT: lambda site, group, name: getattr(site.holder, site.key, None) is group,
    Access.PARTIAL_ARG: lambda site, group, name: site.holder.args[site.key] is group,
    Access.PARTIAL_KEYWORD: lambda site, group, name: site.holder.keywords.get(site.key) is group,
    Access.DEFAULT: lambda site, group, name: site.holder.__defaults__[site.key] is group,
    Access.REGISTRY: _holds_registry,
    Access.CALL: lambda site, group, name: site.bound is group,
    Access.TUPLE_ITEM: _holds_item,
    Access.METHOD_SELF: lambda site, group, name: site.holder.__self__ is group,
}
