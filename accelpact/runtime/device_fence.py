"""The update's device work, fenced at its boundary (a data plane on NCCL only).

On NCCL a collective that fails inside an update raises nothing on the CPU: `Work.wait()` only
orders the streams, so the update's body returns and its boundary would take a failed update for
a committed one. The watchdog aborts the collective after the group timeout and the stream goes
on: the optimizer step the CPU had already queued then runs on half-reduced gradients, and a
Preserve would keep that (found by review; read, not run: no device was lent). So before the
boundary's probes:

- an event recorded where the body ended (on the current stream of the device the groups are bound
  to, `rank_device`) is waited for, polled on this
  thread (a helper thread would wait on its own current device, not this rank's), for at most the
  data timeout, as long as a rank may be late to its boundary check (`DeviceFence`);
- then every NCCL group's recorded error is read (`comm._c10d.device_error`).

Ended with no error: the update's work, its collectives included (the optimizer step waits for
them), is done, and the probes' bound counts from here, not from a backlog the CPU ran ahead of.
Otherwise the failure was inside the update, and its step was queued behind it: the phase is
optimizer where the step ran (Rewind with a pre-step copy, else Reject), never a committed one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..comm import _c10d
from ..comm.backends import cuda_device_of
from ..errors import DeviceWorkFailed
from ..fsm.phases import FailurePhase

_POLL_FIRST_S, _POLL_MAX_S = 5e-5, 2e-3


@dataclass(frozen=True)
class Fenced:
    ended: bool  # the event completed within the bound (False too where a membership change cut the wait)
    waited_s: float
    bound_s: float
    errors: dict[str, str] = field(default_factory=dict)  # label -> what NCCL recorded ("TIMEOUT", ...)

    @property
    def failure(self) -> str | None:
        """The failure's cause, as `DataPlane.diagnose` names causes; None: the update's work ended clean."""
        if not self.ended:
            return (f"timeout: the update's device work did not end within {self.bound_s:.1f} s of its body's end "
                    "(a collective inside it is stuck)")
        if self.errors:
            named = ", ".join(f"{label}: {error}" for label, error in sorted(self.errors.items()))
            return f"comm_error: NCCL recorded a failed collective during the update ({named})"
        return None


def rank_device(groups: Mapping[str, Any]) -> Any:
    """The device this rank's NCCL traffic runs on: the one its groups are bound to
    (`init_process_group(device_id=...)`, which does not make it current), else the current one."""
    bound = [pg for pg in groups.values() if getattr(pg, "bound_device_id", None) is not None]
    return cuda_device_of(bound[0] if bound else None)


def _record_event(device: Any) -> Any:
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))  # where the update's work was queued on this thread
    return event


class DeviceFence:
    """One rank's fence. Its bound is the data timeout, from the body's end: the peers' control
    timeout is derived for a rank that is at most that late to its check (C >= 2D). Found by review:
    a longer bound (600 s at first, then twice the slowest update) held a rank stuck inside a
    failed update far past its peers' check, and they rejected a recoverable fault, or under
    spares declared the live rank lost. The price: on NCCL the data timeout must exceed the device
    work an update may still have queued when its body returns (`Config.data_timeout_s`)."""

    def __init__(self, *, record: Callable[[Any], Any] = _record_event,
                 error_of: Callable[[Any], str | None] = _c10d.device_error,
                 clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep):
        self._record, self._error_of, self._clock, self._pause = record, error_of, clock, pause

    def wait(self, groups: Mapping[str, Any], bound_s: float, cut_short: Callable[[], bool] | None = None) -> Fenced:
        """`cut_short`: a membership change abandons this world (its peers left): stop waiting."""
        event, start = self._record(rank_device(groups)), self._clock()
        delay, ended = _POLL_FIRST_S, True
        while not event.query():
            if self._clock() - start >= bound_s or (cut_short is not None and cut_short()):
                ended = False
                break
            self._pause(delay)
            delay = min(2 * delay, _POLL_MAX_S)
        end = self._clock()
        errors = {label: error for label, pg in groups.items() if (error := self._error_of(pg))}
        return Fenced(ended, end - start, bound_s, errors)


def fence_update(rt: Any, error: BaseException | None,
                 phase: FailurePhase | None) -> tuple[BaseException | None, FailurePhase | None]:
    """The boundary's first step: (error, phase) unchanged where the body raised or the data plane
    has no NCCL group; else the fence, whose failure becomes the update's own (`DeviceWorkFailed`,
    in the optimizer phase where the step ran, else in backward, where its collectives were)."""
    plane = rt.data_plane
    if error is not None or not plane.uses_nccl():
        return error, phase
    fenced = plane.fence.wait(plane.nccl_groups(), plane.timeout_s, plane.cut_short)
    if fenced.failure is None:
        return None, phase
    rt.trace.write({"kind": "device_fence", "update": rt.update_index, "ended": fenced.ended,
                    "waited_s": fenced.waited_s, "bound_s": fenced.bound_s, "errors": fenced.errors})
    stepped = rt.opt_step >= rt.update_index  # the step post-hook counted it: it is queued behind the failure
    return DeviceWorkFailed(fenced.failure), FailurePhase.OPTIMIZER if stepped else FailurePhase.BACKWARD
