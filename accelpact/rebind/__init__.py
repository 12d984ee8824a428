"""Provably complete rebinding of the process-group references cached inside FSDP1, FSDP2 and DDP.

``plan = discover(model, group, extra=[optimizer])`` once (before the group is replaced), then
after each replacement ``plan.rebind(new_group)`` and ``plan.prove()``.
"""

from accelpact.rebind.discovery import discover
from accelpact.rebind.errors import (
    EmptyPlanError,
    MembershipMismatchError,
    NotReadyError,
    RebindError,
    StaleReferenceError,
    UnknownWrapperError,
    UnwritableReferenceError,
)
from accelpact.rebind.groups import data_plane_groups
from accelpact.rebind.plan import DeepCheck, ProofResult, RebindPlan, RebindResult
from accelpact.rebind.sites import Access, Site

__all__ = [
    "Access",
    "DeepCheck",
    "EmptyPlanError",
    "MembershipMismatchError",
    "NotReadyError",
    "ProofResult",
    "RebindError",
    "RebindPlan",
    "RebindResult",
    "Site",
    "StaleReferenceError",
    "UnknownWrapperError",
    "UnwritableReferenceError",
    "data_plane_groups",
    "discover",
]
