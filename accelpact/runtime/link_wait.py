"""The boundary check of a rank that saw a failure, sent once its links answer (the rule is
`fsm.link_wait`, pure; the probe is `control.reach`).

A data-plane collective that timed out may mean a cut link. A check sent now would cross it and
wait for TCP's next retransmission after the link returns; probed first, it goes as soon as a
fresh connection to every peer host gets through. The wait and what it found go into the trace
(`link_wait`) and into the recovery's record (`RecoveryRecord.link_wait_s`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..fsm.link_wait import check_timeout_after, plan_link_wait
from .listeners import checked

log = logging.getLogger("accelpact.runtime")


@dataclass(frozen=True)
class LinkWaited:
    """What one wait for links did, for the trace and the recovery's record."""

    budget_s: float
    waited_s: float
    rounds: int
    reached: tuple[str, ...]
    unreached: tuple[str, ...]
    check_timeout_s: float


def checked_after_links(rt: Any, saw: bool, t_detect: float) -> int:
    """The boundary's control-plane check (`listeners.checked`, carrying this rank's update time
    up to `t_detect`), sent after this rank's links answered when it saw a failure. Sets
    `rt.link_wait` to what the wait did (None: no wait). ControlPlaneError propagates."""
    def check() -> int:
        return checked(rt.listeners, rt.update_index, lambda: rt.stragglers.check(1 if saw else 0, t_detect))

    control = rt.control
    plan = plan_link_wait(saw_failure=saw, probe_interval_s=rt.config.link_probe_s,
                          remote_hosts=len(control.links.targets), data_timeout_s=rt.config.data_timeout_s,
                          control_timeout_s=control.timeout_s)
    rt.link_wait = None
    if plan.budget_s <= 0:
        return check()
    started = time.monotonic()
    try:
        probed = control.probe_links(plan.budget_s, rt.config.link_probe_s)
    except OSError as exc:  # no socket to probe with (descriptors exhausted...): a shortcut lost, no more
        log.warning("accelpact could not probe its links (%s: %s); sending the boundary check now",
                    type(exc).__name__, exc, extra={"update": rt.update_index})
        # what the failed probe already waited comes off the check's timeout, as a finished one's does
        with control.timeout_for(check_timeout_after(waited_s=time.monotonic() - started, plan=plan,
                                                     control_timeout_s=control.timeout_s)):
            return check()
    waited = LinkWaited(plan.budget_s, probed.waited_s, probed.rounds, probed.reached, probed.unreached,
                        check_timeout_after(waited_s=probed.waited_s, plan=plan, control_timeout_s=control.timeout_s))
    rt.link_wait = waited
    rt.trace.write({"kind": "link_wait", "update": rt.update_index, "why": plan.why, **asdict(waited)})
    if probed.unreached:
        log.warning("accelpact: hosts %s did not answer a fresh connection within %.2fs; sending the boundary "
                    "check anyway", ",".join(probed.unreached), probed.waited_s,
                    extra={"update": rt.update_index, "rounds": probed.rounds})
    with control.timeout_for(waited.check_timeout_s):
        return check()
