"""How long a rank that saw a failure waits for its links before sending its boundary check, and
the timeout the check gets after that wait. Pure: no sockets, no clock.

Why wait: a check sent into a cut link waits for the link's next TCP retransmission after it
returns (up to 1 s); one sent after a fresh connection got through goes at once
(`control.reach`). Only a rank that saw a failure waits: a clean rank's boundary has no reason
to suspect a link, and its check must not get slower.

Why this budget: a peer that posted its check early waits at most the control timeout C from its
post. The timeouts are derived (`accelpact.timeouts`) for a last rank that posts two data
timeouts D after the earliest (its update's collective timed out, then a clean peer's
health-check probe that waited for it timed out too). A wait of at most C - 2D keeps every post
inside the earliest poster's window, as without the wait. In that worst case the wait leaves the
check itself no slack, but only when a link stayed silent until the budget's end: a check sent
into that link instead would not have finished sooner, since a stalled connection resumes only
at its next retransmission after the link returns.

Why the check's timeout shrinks: it gets what is left of C after the wait, so a link that never
answers fails the check when it would have failed without the wait. A wait ends at most one probe
interval after its budget (`control.reach.probe`), so no failure is noticed more than that later.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkWaitPlan:
    """`budget_s`: how long to probe (0: do not); `why`: the reason, for the trace."""

    budget_s: float
    why: str


def plan_link_wait(*, saw_failure: bool, probe_interval_s: float, remote_hosts: int, data_timeout_s: float,
                   control_timeout_s: float) -> LinkWaitPlan:
    """Whether, and how long, this rank probes its control-plane peers' hosts before its check."""
    if not saw_failure:
        return LinkWaitPlan(0.0, "this rank saw no failure")
    if probe_interval_s <= 0:
        return LinkWaitPlan(0.0, "link probing is off (link_probe_s=0)")
    if remote_hosts == 0:
        return LinkWaitPlan(0.0, "no peer on another host takes probes")
    budget = control_timeout_s - 2 * data_timeout_s
    if budget <= 0:
        return LinkWaitPlan(0.0, f"the control timeout ({control_timeout_s:g} s) leaves no time beyond two data "
                                 f"timeouts ({data_timeout_s:g} s)")
    return LinkWaitPlan(budget, f"control timeout {control_timeout_s:g} s - 2 x data timeout {data_timeout_s:g} s")


def check_timeout_after(*, waited_s: float, plan: LinkWaitPlan, control_timeout_s: float) -> float:
    """The boundary check's timeout after waiting `waited_s` under `plan`: the rest of C, never
    less than C - budget (the last probe round may end a little after the budget)."""
    if plan.budget_s <= 0:
        return control_timeout_s
    return max(control_timeout_s - waited_s, control_timeout_s - plan.budget_s)
