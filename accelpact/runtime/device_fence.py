"""The update's device work, fenced at its boundary (a data plane on NCCL only).

On NCCL a collective that fails inside an update raises nothing on the CPU: `Work.wait()` only
orders the streams, so the update's body returns and its boundary would take a failed update for
a committed one. The watchdog aborts the collective after the group timeout and the stream goes
on: the optimizer step the CPU had already queued then runs on half-reduced gradients, and a
Preserve would keep that (found by review; read, not run: no device was lent). So before the
boundary's probes:

- an event recorded on the current stream where the body ended is waited for (bounded, polled on
  this thread: a helper thread would wait on its own current device, not this rank's);
- then every NCCL group's recorded error is read (`comm._c10d.device_error`).

Ended with no error: the update's work, its collectives included (the optimizer step waits for
them), is done, and the probes' bound counts from here, not from a backlog the CPU ran ahead of.
Otherwise the failure was inside the update, and its step was queued behind it: the phase is
optimizer where the step ran (Rewind with a pre-step copy, else Reject), never a committed one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..comm import _c10d
from ..errors import DeviceWorkFailed
from ..fsm.phases import FailurePhase

#: The first update's bound (no update measured yet): it may build NCCL communicators lazily and
#: compile. A stuck collective is aborted by the watchdog after the group timeout long before; this
#: bound is for device work that never returns at all.
FIRST_UPDATE_S = 600.0
#: An update's device work may lag its CPU side by about one update (the fence of the previous
#: boundary caught the device up): this many of the slowest recent updates, plus the data timeout.
UPDATES_OF_SLACK = 2.0
_POLL_FIRST_S, _POLL_MAX_S = 5e-5, 2e-3


def fence_bound_s(data_timeout_s: float, recent_updates_s: Sequence[float]) -> float:
    """How long the fence waits for the update's device work (pure)."""
    if not recent_updates_s:
        return max(FIRST_UPDATE_S, data_timeout_s)
    return data_timeout_s + UPDATES_OF_SLACK * max(recent_updates_s)


@dataclass(frozen=True)
class Fenced:
    ended: bool  # the event completed within the bound
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


def _record_event() -> Any:
    import torch

    event = torch.cuda.Event()
    event.record()  # on the current stream of this (the training) thread's current device
    return event


class DeviceFence:
    """One rank's fence; remembers how long recent updates took (fence to fence)."""

    def __init__(self, *, record: Callable[[], Any] = _record_event,
                 error_of: Callable[[Any], str | None] = _c10d.device_error,
                 clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep):
        self._record, self._error_of, self._clock, self._pause = record, error_of, clock, pause
        self.recent: deque[float] = deque(maxlen=8)
        self._last_end: float | None = None

    def wait(self, groups: Mapping[str, Any], data_timeout_s: float) -> Fenced:
        bound = fence_bound_s(data_timeout_s, tuple(self.recent))
        event, start = self._record(), self._clock()
        delay, ended = _POLL_FIRST_S, True
        while not event.query():
            if self._clock() - start >= bound:
                ended = False
                break
            self._pause(delay)
            delay = min(2 * delay, _POLL_MAX_S)
        end = self._clock()
        errors = {label: error for label, pg in groups.items() if (error := self._error_of(pg))}
        if ended:
            if self._last_end is not None:
                self.recent.append(end - self._last_end)
            self._last_end = end
        return Fenced(ended, end - start, bound, errors)


def fence_update(rt: Any, error: BaseException | None,
                 phase: FailurePhase | None) -> tuple[BaseException | None, FailurePhase | None]:
    """The boundary's first step: (error, phase) unchanged where the body raised or the data plane
    has no NCCL group; else the fence, whose failure becomes the update's own (`DeviceWorkFailed`,
    in the optimizer phase where the step ran, else in backward, where its collectives were)."""
    plane = rt.data_plane
    if error is not None or not plane.uses_nccl():
        return error, phase
    fenced = plane.fence.wait(plane.nccl_groups(), plane.timeout_s)
    if fenced.failure is None:
        return None, phase
    rt.trace.write({"kind": "device_fence", "update": rt.update_index, "ended": fenced.ended,
                    "waited_s": fenced.waited_s, "bound_s": fenced.bound_s, "errors": fenced.errors})
    stepped = rt.opt_step >= rt.update_index  # the step post-hook counted it: it is queued behind the failure
    return DeviceWorkFailed(fenced.failure), FailurePhase.OPTIMIZER if stepped else FailurePhase.BACKWARD
