"""The boundary's device fence (NCCL only; `runtime.device_fence`), with a fake event and clock: the
CPU build has no CUDA, and on NCCL a collective that fails inside an update raises nothing on the
CPU, so this fence is what tells a failed update from a committed one there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accelpact.comm.classify import is_communication_failure
from accelpact.errors import DeviceWorkFailed
from accelpact.fsm.phases import FailurePhase
from accelpact.runtime import device_fence
from accelpact.runtime.device_fence import DeviceFence, fence_update


class FakeEvent:
    def __init__(self, clock, ends_at: float | None):
        self.clock, self.ends_at = clock, ends_at

    def query(self) -> bool:
        return self.ends_at is not None and self.clock.now >= self.ends_at


class FakeClock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def fence(clock: FakeClock, device_s: list[float | None], errors: dict | None = None) -> DeviceFence:
    """A fence whose n-th event completes `device_s[n]` seconds after it is recorded (None: never)."""
    durations = iter(device_s)

    def record(device):
        assert device == torch.device("cuda", 1)  # the groups' bound device (see `bound`)
        took = next(durations)
        return FakeEvent(clock, None if took is None else clock.now + took)

    return DeviceFence(record=record, error_of=lambda pg: (errors or {}).get(pg.name), clock=clock, pause=clock.sleep)


def bound(name: str) -> SimpleNamespace:
    """A group bound to cuda:1 (`init_process_group(device_id=...)`), which need not be the current device."""
    return SimpleNamespace(name=name, bound_device_id=torch.device("cuda", 1))


def test_an_update_whose_device_work_ends_is_clean():
    clock = FakeClock()
    f = fence(clock, [0.2])
    fenced = f.wait({"shard": bound("pg-shard")}, 2.0)
    assert fenced.ended and fenced.failure is None and fenced.bound_s == 2.0
    assert 0.2 <= fenced.waited_s < 0.21  # polled, backing off from 50 us to at most 2 ms
    assert max(clock.slept) <= 2e-3 and clock.slept[0] == pytest.approx(5e-5)


def test_device_work_that_does_not_end_within_the_data_timeout_is_a_stuck_update():
    """The bound is the data timeout from the body's end: the peers' control timeout counts on a
    rank being at most that late to its check."""
    clock = FakeClock()
    stuck = fence(clock, [None]).wait({"shard": bound("pg-shard")}, 2.0)
    assert not stuck.ended and 2.0 <= stuck.waited_s < 2.01
    assert stuck.failure.startswith("timeout: the update's device work did not end within 2.0 s")


def test_a_membership_change_cuts_the_fence_short():
    clock = FakeClock()
    left = fence(clock, [None]).wait({"shard": bound("pg-shard")}, 2.0, cut_short=lambda: clock.now > 0.1)  # the peers left this world
    assert not left.ended and left.waited_s < 0.11


def test_a_collective_the_watchdog_aborted_is_a_failure_although_the_work_ended():
    """The watchdog aborts a timed-out collective and the stream goes on: the event completes, and
    only the group's recorded error says the update's reduction never happened."""
    clock = FakeClock()
    f = fence(clock, [0.3], errors={"pg-replicate": "TIMEOUT"})
    fenced = f.wait({"shard": bound("pg-shard"), "replicate": bound("pg-replicate")}, 2.0)
    assert fenced.ended and fenced.errors == {"replicate": "TIMEOUT"}
    assert fenced.failure == "comm_error: NCCL recorded a failed collective during the update (replicate: TIMEOUT)"


def _rt(*, nccl: bool, result: device_fence.Fenced, opt_step: int, update_index: int = 5):
    trace = []
    plane = SimpleNamespace(uses_nccl=lambda: nccl, nccl_groups=lambda: {"shard": "pg"}, timeout_s=2.0,
                            fence=SimpleNamespace(wait=lambda groups, bound_s, cut_short: result), cut_short=None)
    return SimpleNamespace(data_plane=plane, trace=SimpleNamespace(write=trace.append), opt_step=opt_step,
                           update_index=update_index), trace


def test_the_boundary_takes_a_fence_failure_for_the_updates_own_in_the_phase_its_step_reached():
    stuck = device_fence.Fenced(ended=False, waited_s=4.0, bound_s=4.0)
    rt, trace = _rt(nccl=True, result=stuck, opt_step=5)  # the step post-hook counted update 5
    error, phase = fence_update(rt, None, None)
    assert isinstance(error, DeviceWorkFailed) and phase is FailurePhase.OPTIMIZER
    assert trace[0]["kind"] == "device_fence" and trace[0]["ended"] is False
    rt, _ = _rt(nccl=True, result=stuck, opt_step=4)  # no step ran (its collectives were in backward)
    assert fence_update(rt, None, None)[1] is FailurePhase.BACKWARD
    # a communication failure by declaration: recovered (Rewind or Reject), never taken for a bug
    assert is_communication_failure(error) and error.failure_cause.startswith("timeout:")


def test_the_fence_is_not_waited_where_it_cannot_tell_anything():
    clean = device_fence.Fenced(ended=True, waited_s=0.1, bound_s=2.0)
    rt, trace = _rt(nccl=True, result=clean, opt_step=5)
    assert fence_update(rt, None, None) == (None, None) and trace == []
    raised = RuntimeError("the body raised")
    rt, _ = _rt(nccl=True, result=device_fence.Fenced(ended=False, waited_s=1, bound_s=1), opt_step=5)
    assert fence_update(rt, raised, FailurePhase.FORWARD) == (raised, FailurePhase.FORWARD)  # its own failure
    rt, _ = _rt(nccl=False, result=device_fence.Fenced(ended=False, waited_s=1, bound_s=1), opt_step=5)
    assert fence_update(rt, None, None) == (None, None)  # gloo: a failed collective raises on the CPU
