"""What runs right after a commit, on every rank alike and in this order: the replica digest
check (`digests.py`), then the checkpoint save (`checkpointing.py`), so that a checkpoint is
never taken of replicas that disagree. Either one failing fails stop on every rank together:
each rank holds the same agreed result (the gathered digests, the collective save's error).

Both run on the control plane with nothing before them to detect a cut link: a cut that begins
inside a save stalls the save's first collective across it from its first second. A cut at an
update is given the data timeout to be detected and then the control timeout to heal (a Preserve
rides it out); so the work after a commit is given their sum (`budget_s`), and a link cut for
less than that stalls the save instead of failing the job to its last checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ControlPlaneError
from .digests import ReplicaDivergence

if TYPE_CHECKING:
    from .runtime import Runtime


def budget_s(rt: Runtime) -> float:
    """How long one collective after a commit may wait: what a cut at an update may last and still
    be recovered in memory (its detection, then the recovery's control-plane bound)."""
    return float(rt.config.data_timeout_s) + float(rt.config.control_timeout_s)


def after_commit(rt: Runtime) -> None:
    digests_due = rt.digests is not None and rt.digests.due(rt.frontier)
    save_due = rt.checkpointer is not None and rt.checkpointer.due(rt.frontier)
    if not (digests_due or save_due):
        return  # the usual update: nothing to stretch
    failure = None
    with rt.control.timeout_for(budget_s(rt)):
        if digests_due:
            try:
                rt.digests.after_commit(rt)
            except (ReplicaDivergence, ControlPlaneError) as exc:
                failure = f"replica digest check at F={rt.frontier}: {exc}", exc
        if save_due and failure is None:
            try:
                rt.checkpointer.after_commit(rt)
            except Exception as exc:  # every rank gets the same agreed save error: fail-stop
                failure = f"checkpoint save at F={rt.frontier} failed: {type(exc).__name__}: {exc}", exc
    if failure is not None:  # outside the stretch: the reject's own waits keep the usual bound
        rt._reject_without_protocol(*failure)
