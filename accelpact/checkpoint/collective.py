"""The few collectives the checkpoint layer needs, with one failure rule: all ranks agree.

Every decision (which step to load, whether a save may publish) is taken on rank 0 and
broadcast, and every local failure is gathered before anyone acts on it, so no rank publishes,
loads or raises alone while its peers block in a collective. Without an initialised process
group this degrades to a world of one, which keeps single-process use and unit tests simple.
Object collectives need a Gloo group (or a current CUDA device for NCCL); the runtime's control
plane group is the natural choice for ``group``.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

import torch.distributed as dist

from .errors import CheckpointError

T = TypeVar("T")


class Comm:
    """Rank, world size and object collectives over ``group`` (default WORLD)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.enabled = dist.is_available() and dist.is_initialized()
        if group is not None and not self.enabled:
            raise CheckpointError("a process group was given but torch.distributed is not initialised")
        self.group = group
        self.rank = dist.get_rank(group) if self.enabled else 0
        self.world_size = dist.get_world_size(group) if self.enabled else 1

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: T | None) -> T:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj  # type: ignore[return-value]
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]  # type: ignore[return-value]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by group rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.enabled:
            self.all_gather(None)  # an object collective: works on Gloo and NCCL groups alike

    def agree(self, local_error: BaseException | str | None, what: str,
              exc: type[CheckpointError] = CheckpointError) -> None:
        """Raise ``exc`` on every rank if any rank reports an error (a barrier otherwise). The peers
        get each failed rank's error as text; a rank that failed with an exception raises ``exc``
        from it, so its own traceback keeps the original."""
        errors = self.all_gather(describe(local_error))
        failed = [(r, e) for r, e in enumerate(errors) if e]
        if failed:
            detail = "; ".join(f"rank {r}: {e}" for r, e in failed)
            raise_from_local(exc(f"{what} failed on {len(failed)} of {self.world_size} rank(s): {detail}",
                                 ranks=[r for r, _ in failed], agreed=True), local_error)


def describe(error: BaseException | str | None) -> str | None:
    """An error as the text the ranks exchange: 'Type: message' for an exception."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return error


def raise_from_local(error: BaseException, local: BaseException | str | None) -> NoReturn:
    """Raise the agreed ``error``, chained to this rank's own exception when it had one."""
    if isinstance(local, BaseException):
        raise error from local
    raise error
