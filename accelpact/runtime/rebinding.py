"""RebindReferences handler: redirect every cached reference to the replacement, then prove
that none still names the retired group (the stale-reference proof)."""

from __future__ import annotations

import logging

from ..errors import RebindError
from ..fsm.effects import RebindReferences, StepResult
from ..rebind.mesh import one_cache_decision
from ..rebind.plan import RebindPlan
from .data_plane import DataPlane
from .replace import Pending

log = logging.getLogger("accelpact.runtime")


def rebind_references(plane: DataPlane, effect: RebindReferences, pending: Pending, *, rebind: bool,
                      counts: dict[str, int]) -> StepResult:
    """`rebind=False` is the paper's causal ablation: groups are replaced, references are not."""
    label = None  # the group being rebound, for the vote's reason
    try:
        with one_cache_decision():  # after every group's plan, not after the first (mesh.one_cache_decision)
            for label, (old, new) in pending.items():
                if rebind:
                    report = _plan(plane, label).rebind(new)
                    plane.plans[label].prove(old)
                    for kind, n in report.counts.items():
                        counts[kind] = counts.get(kind, 0) + n
                plane.install(label, new, effect.generation, rebound=rebind)
    except (RebindError, KeyError) as exc:
        log.error("rebinding group %r failed", label, exc_info=exc)
        return StepResult.failed(exc, f"rebinding group {label!r}: ")
    except Exception as exc:  # a framework's own setter (DDP's reducer, an after-rebind action) raised:
        # the vote carries it; escaping, it would take this rank out of the protocol and leave its
        # peers waiting in validation and the vote for the control timeout
        log.error("rebinding group %r failed in the framework", label, exc_info=exc)
        return StepResult.failed(exc, f"rebinding group {label!r} failed in the framework: ")
    return StepResult(True)


def _plan(plane: DataPlane, label: str) -> RebindPlan:
    """The rebind plan of `label`, or an error that says why there is none (a bare KeyError was
    the whole vote reason): its discovery failed or never ran, so its references are unknown."""
    plan = plane.plans.get(label)
    if plan is None:
        raise RebindError(f"no rebind plan for group {label!r}: its discovery failed or never ran (plans exist for "
                          f"{sorted(plane.plans) or 'no group'}), so the references to it are unknown")
    return plan
