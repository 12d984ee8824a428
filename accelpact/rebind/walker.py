"""Generic object-graph walk that finds every reachable reference to one process group.

``gc.get_referrers`` cannot do this (process groups are not gc-tracked), so the walk follows
what can hold a reference: instance ``__dict__``s and ``__slots__``, dicts (values and keys),
lists, deques, tuples, sets, ``functools.partial`` objects, closures and defaults of functions,
and bound methods. It is breadth-first with ``nn.Module`` children first, so each reference is
reported under its shortest, most readable path (``layers.3._inter_node_state.process_group``;
FSDP1's ``_fsdp_wrapped_module`` hops are elided as FSDP does in its parameter names).

Not walked, by design: module globals and class attributes (not per-model state), weak
references (they cannot keep a retired group alive), and the inside of C++ objects, which are
reported as opaque so that rules can claim them or discovery can refuse them.
"""

from __future__ import annotations

import collections
import enum
import functools
import threading
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch._C._distributed_c10d import ProcessGroup, Store

from accelpact.rebind.sites import Access, Site

__all__ = ["Opaque", "WalkResult", "walk"]

_HIDDEN_MODULE_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
_COMPOSABLE_KEY_PREFIX = "__composable_api_state_key"
_MAX_OBJECTS = 5_000_000


class _Kind(enum.Enum):
    LEAF = 0
    DICT = 1
    LIST = 2
    TUPLE = 3
    SET = 4
    FROZENSET = 5
    PARTIAL = 6
    FUNCTION = 7
    METHOD = 8
    BUILTIN_METHOD = 9
    MODULE = 10
    TENSOR = 11
    OBJECT = 12
    OPAQUE = 13
    MAPPING_PROXY = 14


_LEAF_TYPES: tuple[type, ...] = (
    type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, type, types.ModuleType,
    types.CodeType, weakref.ReferenceType, weakref.ProxyType, weakref.CallableProxyType, weakref.WeakSet,
    torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout, torch.Generator, torch.Stream,
    torch.Event, ProcessGroup, Store, enum.Enum, type(threading.Lock()), type(threading.RLock()),
    types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, type(Ellipsis), type(NotImplemented),
)


@dataclass
class Opaque:
    """An object the walk cannot look inside (no ``__dict__``, no slots): a C++ object, usually."""

    obj: Any
    path: str


@dataclass
class WalkResult:
    """References to the target (as generic sites), watched objects by watch key, opaque objects."""

    sites: list[Site] = field(default_factory=list)
    watched: dict[str, list[tuple[Any, str]]] = field(default_factory=dict)
    opaque: list[Opaque] = field(default_factory=list)
    visited: int = 0


_kind_cache: dict[type, _Kind] = {}
_slot_cache: dict[type, tuple[str, ...]] = {}


def _kind_of(cls: type) -> _Kind:
    kind = _kind_cache.get(cls)
    if kind is None:
        kind = _kind_cache[cls] = _classify_type(cls)
    return kind


def _classify_type(cls: type) -> _Kind:
    if issubclass(cls, _LEAF_TYPES):
        return _Kind.LEAF
    if issubclass(cls, nn.Module):
        return _Kind.MODULE
    if issubclass(cls, torch.Tensor):
        return _Kind.TENSOR
    if issubclass(cls, dict):
        return _Kind.DICT
    if issubclass(cls, list | collections.deque):
        return _Kind.LIST
    if issubclass(cls, tuple):
        return _Kind.TUPLE
    if issubclass(cls, set):
        return _Kind.SET
    if issubclass(cls, frozenset):
        return _Kind.FROZENSET
    if issubclass(cls, functools.partial):
        return _Kind.PARTIAL
    if issubclass(cls, types.FunctionType):
        return _Kind.FUNCTION
    if issubclass(cls, types.MethodType):
        return _Kind.METHOD
    if issubclass(cls, types.BuiltinMethodType | types.MethodWrapperType):
        return _Kind.BUILTIN_METHOD
    if issubclass(cls, types.MappingProxyType):
        return _Kind.MAPPING_PROXY
    if cls.__dictoffset__ or _slots_of(cls):
        return _Kind.OBJECT
    return _Kind.OPAQUE


def _slots_of(cls: type) -> tuple[str, ...]:
    slots = _slot_cache.get(cls)
    if slots is None:
        names: list[str] = []
        for klass in cls.__mro__:
            declared = klass.__dict__.get("__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if name not in ("__dict__", "__weakref__") and name not in names:
                    names.append(name)
        slots = _slot_cache[cls] = tuple(names)
    return slots


# An edge: (segment, child, access, holder, key). Segments start with "." (attribute) or "[" (item).
Edge = tuple[str, Any, Access, Any, Any]


def _item_segment(key: Any) -> str:
    if isinstance(key, str | int):
        return f"[{key}]"
    qualname = getattr(key, "__qualname__", None)
    return f"[{qualname}]" if qualname else f"[{type(key).__name__}]"


def _dict_edges(holder: dict) -> Iterator[Edge]:
    for key, value in list(holder.items()):
        yield _item_segment(key), value, Access.ITEM, holder, key
        if not isinstance(key, str | int):
            yield f"<key {_item_segment(key)[1:-1]}>", key, Access.DICT_KEY, holder, key


def _attribute_edges(holder_dict: dict, skip: frozenset[str] = frozenset()) -> Iterator[Edge]:
    for key, value in list(holder_dict.items()):
        if key in skip:
            continue
        segment = ".<composable>" if str(key).startswith(_COMPOSABLE_KEY_PREFIX) else f".{key}"
        yield segment, value, Access.ITEM, holder_dict, key


def _slot_edges(obj: Any) -> Iterator[Edge]:
    for name in _slots_of(type(obj)):
        try:
            value = getattr(obj, name)
        except AttributeError:
            continue
        yield f".{name}", value, Access.SLOT, obj, name


def _function_edges(fn: types.FunctionType) -> Iterator[Edge]:
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # empty cell
            continue
        yield f".<closure {name}>", contents, Access.CELL, cell, None
    for index, value in enumerate(fn.__defaults__ or ()):
        yield f".<default {index}>", value, Access.DEFAULT, fn, index
    if fn.__kwdefaults__:
        yield from _dict_edges(fn.__kwdefaults__)
    if fn.__dict__:
        yield from _attribute_edges(fn.__dict__)


#: Where a tensor keeps the hooks registered on it (`register_hook`,
#: `register_post_accumulate_grad_hook`): on the C++ side, not in its `__dict__`, so a group a
#: hook's closure or default holds would be neither rebound nor refused without them.
_TENSOR_HOOK_TABLES = ("_backward_hooks", "_post_accumulate_grad_hooks")


def _tensor_hook_edges(tensor: Any) -> Iterator[Edge]:
    for name in _TENSOR_HOOK_TABLES:
        hooks = getattr(tensor, name, None)
        if hooks:
            yield f".{name}", hooks, Access.SLOT, tensor, name


def _edges(obj: Any, kind: _Kind) -> Iterator[Edge]:
    if kind is _Kind.MODULE:
        yield from _attribute_edges(obj.__dict__, skip=frozenset({"_modules"}))
    elif kind is _Kind.OBJECT or kind is _Kind.TENSOR:
        instance_dict = getattr(obj, "__dict__", None)
        if instance_dict:
            yield from _attribute_edges(instance_dict)
        yield from _slot_edges(obj)
        if kind is _Kind.TENSOR:
            yield from _tensor_hook_edges(obj)
    elif kind is _Kind.DICT:
        yield from _dict_edges(obj)
    elif kind is _Kind.LIST:
        for index, value in enumerate(list(obj)):
            yield f"[{index}]", value, Access.ITEM, obj, index
    elif kind is _Kind.TUPLE:
        for index, value in enumerate(obj):
            yield f"[{index}]", value, Access.TUPLE_ITEM, obj, index
    elif kind is _Kind.SET:
        for value in list(obj):
            yield "{member}", value, Access.SET_MEMBER, obj, None
    elif kind is _Kind.FROZENSET:
        for value in obj:
            yield "{member}", value, Access.FROZEN_MEMBER, obj, None
    elif kind is _Kind.PARTIAL:
        yield ".func", obj.func, Access.METHOD_SELF, obj, None
        for index, value in enumerate(obj.args):
            yield f".args[{index}]", value, Access.PARTIAL_ARG, obj, index
        for key, value in obj.keywords.items():
            yield f".keywords[{key}]", value, Access.PARTIAL_KEYWORD, obj, key
        if obj.__dict__:
            yield from _attribute_edges(obj.__dict__)
    elif kind is _Kind.FUNCTION:
        yield from _function_edges(obj)
    elif kind is _Kind.METHOD or kind is _Kind.BUILTIN_METHOD:
        yield ".__self__", obj.__self__, Access.METHOD_SELF, obj, None
        function = getattr(obj, "__func__", None)
        if function is not None:
            yield ".__func__", function, Access.METHOD_SELF, obj, None
    elif kind is _Kind.MAPPING_PROXY:
        for key, value in obj.items():
            yield _item_segment(key), value, Access.TUPLE_ITEM, obj, key


def _clean_module_name(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _HIDDEN_MODULE_SEGMENTS)


class _Paths:
    """Paths stored as parent links; a string is built only for what gets reported."""

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._segment: list[str] = []

    def add(self, parent: int, segment: str) -> int:
        self._parent.append(parent)
        self._segment.append(segment)
        return len(self._parent) - 1

    def render(self, node: int, last: str = "") -> str:
        parts = [last] if last else []
        while node >= 0:
            parts.append(self._segment[node])
            node = self._parent[node]
        text = "".join(reversed(parts))
        return text[1:] if text.startswith(".") else text


def walk(
    roots: Sequence[tuple[str, Any]],
    target: Any,
    *,
    watch: Mapping[str, tuple[type, ...]] | None = None,
) -> WalkResult:
    """Find every reference to ``target`` reachable from ``roots`` (``(name, object)`` pairs).

    ``watch`` maps a key to types; every reachable instance of them is reported under that key
    with its path, so that framework rules can inspect them without a second walk.
    """
    watch = dict(watch or {})
    result = WalkResult(watched={key: [] for key in watch})
    paths = _Paths()
    seen: set[int] = {id(target)}
    # Hook dictionaries are walked last: what they reach (FSDP states, param groups) is reported
    # under its structural path rather than through some hook's closure.
    queue: collections.deque[tuple[Any, int]] = collections.deque()
    deferred: collections.deque[tuple[Any, int]] = collections.deque()
    watch_cache: dict[type, tuple[str, ...]] = {}

    enumerated: set[int] = set()  # modules whose children were enqueued by named_modules()
    for root_name, root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        root_node = paths.add(-1, f".{root_name}" if root_name else "")
        queue.append((root, root_node))
        if isinstance(root, nn.Module):
            for name, module in root.named_modules():
                enumerated.add(id(module))
                if name and id(module) not in seen:
                    seen.add(id(module))
                    queue.append((module, paths.add(root_node, "." + _clean_module_name(name))))

    while queue or deferred:
        if not queue:
            queue, deferred = deferred, queue
        obj, node = queue.popleft()
        result.visited += 1
        if result.visited > _MAX_OBJECTS:
            raise RuntimeError(f"object graph walk exceeded {_MAX_OBJECTS} objects; refusing to continue")
        cls = type(obj)
        keys = watch_cache.get(cls)
        if keys is None:
            keys = watch_cache[cls] = tuple(key for key, types_ in watch.items() if issubclass(cls, types_))
        for key in keys:
            result.watched[key].append((obj, paths.render(node)))
        kind = _kind_of(cls)
        if kind is _Kind.MODULE and id(obj) not in enumerated:
            kind = _Kind.OBJECT  # a module met on the way: walk its _modules like any attribute
        if kind is _Kind.OPAQUE:
            result.opaque.append(Opaque(obj, paths.render(node)))
            continue
        for segment, child, access, holder, key in _edges(obj, kind):
            if child is target:
                result.sites.append(Site(paths.render(node, segment), f"generic.{access.value}", access, holder, key))
            elif id(child) not in seen and _kind_of(type(child)) is not _Kind.LEAF:
                seen.add(id(child))
                later = kind is _Kind.MODULE and "hook" in segment
                (deferred if later else queue).append((child, paths.add(node, segment)))
    return result
