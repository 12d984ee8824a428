"""Errors of reference discovery and rebinding; each names what it is about (paths, ranks).

They all derive from :class:`RebindError`, defined in :mod:`accelpact.errors` under
:class:`~accelpact.errors.AccelPactError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RebindError

__all__ = [
    "EmptyPlanError",
    "MembershipMismatchError",
    "NotReadyError",
    "RebindError",
    "StaleReferenceError",
    "UnknownWrapperError",
    "UnwritableReferenceError",
]


def _listing(items: Sequence[str], limit: int = 20) -> str:
    shown = "\n  ".join(items[:limit])
    more = f"\n  … and {len(items) - limit} more" if len(items) > limit else ""
    return f"\n  {shown}{more}"


class EmptyPlanError(RebindError):
    """Discovery found no reference to the group: wrong group, or a model that does not use it."""


class MembershipMismatchError(RebindError):
    """The new group's members differ from the old group's; nothing was written."""

    def __init__(self, expected: Sequence[int], actual: Sequence[int] | None, detail: str = "") -> None:
        self.expected = list(expected)
        self.actual = None if actual is None else list(actual)
        shown = "unknown to c10d (not registered)" if actual is None else str(self.actual)
        super().__init__(f"new group has members {shown}, the replaced group had {self.expected}"
                         f"{': ' + detail if detail else ''}; nothing was rebound",
                         expected=self.expected, actual=self.actual)


class StaleReferenceError(RebindError):
    """Sites that do not hold the current group (or still name a retired one), by path."""

    def __init__(self, group_name: str, paths: Sequence[str], retired_name: str | None = None) -> None:
        self.group_name = group_name
        self.retired_name = retired_name
        self.paths = list(paths)
        retired = f" (retired: {retired_name!r})" if retired_name else ""
        super().__init__(f"{len(self.paths)} stale reference(s): not {group_name!r}{retired}:{_listing(self.paths)}",
                         group=group_name, retired=retired_name)


class UnknownWrapperError(RebindError):
    """An object that holds the group where no rule and no generic route can reach it."""

    def __init__(self, group_name: str, findings: Sequence[str]) -> None:
        self.group_name = group_name
        self.findings = list(findings)
        super().__init__(f"objects hold {group_name!r} in a way no rebind rule knows; refusing a partial "
                         f"rebind:{_listing(self.findings)}", group=group_name)


class UnwritableReferenceError(RebindError):
    """References found by the generic walk that cannot be rewritten in place (tuples, bound methods…)."""

    def __init__(self, group_name: str, paths: Sequence[str]) -> None:
        self.group_name = group_name
        self.paths = list(paths)
        super().__init__(f"{len(self.paths)} reference(s) to {group_name!r} cannot be rewritten in place:"
                         f"{_listing(self.paths)}", group=group_name)


class NotReadyError(RebindError):
    """The framework has not finished building its references yet (lazy initialisation pending)."""
