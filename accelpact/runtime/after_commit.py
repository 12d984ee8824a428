"""What runs right after a commit, on every rank alike and in this order: the replica digest
check (`digests.py`), then the checkpoint save (`checkpointing.py`), so that a checkpoint is
never taken of replicas that disagree. Either one failing fails stop on every rank together:
each rank holds the same agreed result (the gathered digests, the collective save's error)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ControlPlaneError
from .digests import ReplicaDivergence

if TYPE_CHECKING:
    from .runtime import Runtime


def after_commit(rt: Runtime) -> None:
    if rt.digests is not None:
        try:
            rt.digests.after_commit(rt)
        except (ReplicaDivergence, ControlPlaneError) as exc:
            rt._reject_without_protocol(f"replica digest check at F={rt.frontier}: {exc}", exc)
    if rt.checkpointer is not None:
        try:
            rt.checkpointer.after_commit(rt)
        except Exception as exc:  # every rank gets the same agreed save error: fail-stop
            rt._reject_without_protocol(f"checkpoint save at F={rt.frontier} failed: "
                                        f"{type(exc).__name__}: {exc}", exc)
