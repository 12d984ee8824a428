"""Undo what attach installed, also after a close whose settle failed: threads, hooks, the
attached mark, the trace, the control plane, the standbys; and put a clean close on record as
the end of training (`Checkpointer.record_finished`). Without it a close that raised (a
Reject re-raised under `on_reject="raise"`, a snapshot that could not be restored) left the
model marked attached, its hooks in place and the check thread running: a second attach was
refused until close() was called again."""

from __future__ import annotations

import logging
from typing import Any

from .ddp_buckets import release_buckets as release_ddp_buckets
from .member_change import stop_workers

log = logging.getLogger("accelpact.runtime")


def detach(rt: Any, attached_mark: str) -> None:
    """Release everything `rt` holds (idempotent). A boundary-check thread that did not end within
    its join is still waiting inside the control plane's group: the plane is then left open
    (closing a gloo group under a live wait can crash the process) and that is logged."""
    if rt.checkpointer is not None:  # first: the end of training on record, unless an exception is in flight
        rt.checkpointer.record_finished()
    rt.observers.close()
    stop_workers(rt)
    rt._tracker.remove()
    release_ddp_buckets(rt.model)
    rt.model.__dict__.pop(attached_mark, None)  # the mark attach set
    rt.trace.close()
    checks = rt.deferral.checks
    if checks is not None and checks.stuck:
        log.error("accelpact left its control plane open at close: the boundary-check thread is still waiting in "
                  "it (it did not end within its join); the process should exit", extra={"rank": rt.rank})
    else:
        rt.control.close()
    rt.data_plane.standby.clear()
    rt.data_plane.restore_timeouts()  # the groups are the user's again, under the user's own timeout
