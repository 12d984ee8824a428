"""Rebind plans discovered at the first boundary (FSDP1 builds its flat parameters lazily, in
its first forward, so the references to rebind exist only then)."""

from __future__ import annotations

import logging

from ..errors import ControlPlaneError
from ..fsm.phases import FailurePhase

log = logging.getLogger("accelpact.runtime")


def discover_late(rt, error: BaseException | None, phase: FailurePhase | None, *, line_up: bool = True):
    """Discover, then line the ranks up again before the health check (every rank defers
    alike: the same wrapper type). A discovery failure becomes this boundary's failure:
    returns the boundary's (error, phase)."""
    try:
        rt.prepare()
    except Exception as exc:  # RebindError and whatever the walk meets; it goes to the evidence
        log.error("rebind discovery failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        if error is None:
            error, phase = exc, FailurePhase.COMMITTED
        else:  # the update failed too: its error is the boundary's, and carries why rebind cannot work (not
            # tried again later: every rank lines up after discovery alike, and a retry would be one rank's)
            error.add_note(f"accelpact: rebind plans could not be discovered: {type(exc).__name__}: {exc}")
    try:
        if line_up:
            rt.control.boundary_check(0)
    except ControlPlaneError as exc:  # where the update failed, if it did (found by review: "committed")
        rt._reject_without_protocol(f"control plane failed after discovery: {exc}", error or exc, phase)
    return error, phase
