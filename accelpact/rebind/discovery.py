"""``discover``: one walk, framework rules, refusals, and a plan — or a clear error, never half a plan."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch._C._distributed_c10d import Backend, Logger, ProcessGroup, Reducer

from accelpact.comm import _c10d
from accelpact.rebind.ddp import DDPRule
from accelpact.rebind.errors import (
    EmptyPlanError,
    RebindError,
    UnknownWrapperError,
    UnwritableReferenceError,
)
from accelpact.rebind.fsdp1 import FSDP1Rule
from accelpact.rebind.fsdp2 import FSDP2Rule
from accelpact.rebind.mesh import MeshRule, meshes_of
from accelpact.rebind.plan import RebindPlan
from accelpact.rebind.rule import Rule, RuleContext
from accelpact.rebind.sites import Access
from accelpact.rebind.walker import walk

log = logging.getLogger("accelpact.rebind")

__all__ = ["RULES", "discover", "walk_for"]

# Order matters only for labels: framework rules first, the mesh rule (shared by FSDP1 with a
# mesh and FSDP2) last.
RULES: tuple[Rule, ...] = (FSDP1Rule(), FSDP2Rule(), DDPRule(), MeshRule())

# Attribute names under which an opaque (C++) object would expose a group it holds.
_GROUP_ATTRIBUTES = ("process_group", "_process_group", "pg", "_pg", "group", "_group")


def discover(
    root: Any,
    group: ProcessGroup,
    *,
    extra: Iterable[Any] | Mapping[str, Any] = (),
) -> RebindPlan:
    """Find every site that holds ``group`` in ``root`` and ``extra`` (optimizer, meshes…), once.

    Call it while ``group`` is still registered (before ``replace_group``) and after the first
    update (FSDP initialises lazily). Raises ``EmptyPlanError`` when nothing holds the group,
    ``UnwritableReferenceError`` for references that cannot be rewritten in place (tuples, bound
    methods of the group), ``UnknownWrapperError`` for C++ objects that hold it where no rule
    reaches, and ``NotReadyError`` before FSDP's lazy initialisation.
    """
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"discover needs a ProcessGroup, got {type(group).__qualname__}")
    ranks = _c10d.registered_ranks(group)
    if ranks is None:
        raise RebindError(f"group {group.group_name!r} is not registered with c10d (already retired?): "
                          "discover references before replacing the group")
    start = time.perf_counter_ns()
    roots = _roots(root, extra)
    ctx = walk_for(roots, group)
    _follow_group_keys(ctx)
    _refuse_unwritable(ctx)
    _refuse_unknown_wrappers(ctx)
    plan = RebindPlan(group, ranks, ctx.sites, meshes=meshes_of(ctx), roots=roots,
                      discover_us=(time.perf_counter_ns() - start) / 1e3, visited=ctx.walk.visited,
                      after_rebind=ctx.after_rebind)
    if plan.references == 0:
        raise EmptyPlanError(f"nothing reachable from {type(root).__qualname__} (and {len(roots) - 1} extra "
                             f"object(s)) holds group {group.group_name!r} with ranks {ranks}")
    return plan


def walk_for(roots: Sequence[tuple[str, Any]], group: ProcessGroup) -> RuleContext:
    """The walk plus every rule, for ``group``; shared by ``discover`` and ``verify_deep``."""
    watch: dict[str, tuple[type, ...]] = {}
    for rule in RULES:
        watch.update(rule.watch)
    ctx = RuleContext(group, walk(roots, group, watch=watch))
    for rule in RULES:
        rule.apply(ctx)
    return ctx


def _roots(root: Any, extra: Iterable[Any] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    named = list(extra.items()) if isinstance(extra, Mapping) else [
        (f"extra[{index}]", obj) for index, obj in enumerate(extra)]
    return [("", root), *((str(name), obj) for name, obj in named)]


def _follow_group_keys(ctx: RuleContext) -> None:
    """A dict that maps the group to itself ({g: g}) has an item site keyed by the group: once the
    key moves, ``holder[old] = new`` would put the retired key back beside the new one. Such a
    site follows its key instead (``Access.KEYED_ITEM``), the DICT_KEY write carries the value."""
    for site in ctx.sites:
        if site.access is Access.ITEM and site.key is ctx.target:
            site.access = Access.KEYED_ITEM


def _refuse_unwritable(ctx: RuleContext) -> None:
    unwritable = [f"{site.path} ({site.access.value})" for site in ctx.sites if not site.writable]
    if unwritable:
        raise UnwritableReferenceError(ctx.target_name, unwritable)


def _refuse_unknown_wrappers(ctx: RuleContext) -> None:
    target_backends = _c10d.group_backends(ctx.target)
    findings = []
    for opaque in ctx.walk.opaque:
        obj = opaque.obj
        if ctx.is_claimed(obj):
            continue
        if isinstance(obj, Reducer | Logger):
            findings.append(f"{opaque.path}: a DDP {type(obj).__name__} outside any DistributedDataParallel "
                            "the rebinder knows (its C++ process group cannot be checked or rebound)")
        elif isinstance(obj, Backend) and any(obj is backend for backend in target_backends):
            findings.append(f"{opaque.path}: holds the group's {type(obj).__name__} backend, not the group")
        else:
            for attribute in _GROUP_ATTRIBUTES:
                try:
                    value = getattr(obj, attribute, None)
                except Exception as exc:  # a C++ getter that fails is no evidence either way
                    log.debug("%s: reading %s.%s failed (%s: %s); not evidence either way", opaque.path,
                              type(obj).__qualname__, attribute, type(exc).__name__, exc)
                    continue
                if value is ctx.target:
                    findings.append(f"{opaque.path}: {type(obj).__qualname__}.{attribute} is the group, inside "
                                    "an object the walk cannot rewrite")
                    break
    if findings:
        raise UnknownWrapperError(ctx.target_name, findings)
