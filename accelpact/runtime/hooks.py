"""Where an update stands: hooks on the model and the optimizer that track the failure phase
(forward, backward, optimizer) of the update in flight and tell the runtime at each change."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..fsm.phases import FailurePhase


class PhaseTracker:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 on_phase: Callable[[FailurePhase], None], before_step: Callable[[], None],
                 after_step: Callable[[], None]):
        self.phase: FailurePhase | None = None  # None: between updates (hooks stay silent)
        self._on_phase, self._before_step, self._after_step = on_phase, before_step, after_step
        self._handles = [
            model.register_forward_pre_hook(self._forward_pre),
            model.register_forward_hook(self._forward),
            optimizer.register_step_pre_hook(self._step_pre),
            optimizer.register_step_post_hook(self._step_post),
        ]

    def begin(self) -> None:
        """An update starts (its first forward will announce the phase)."""
        self.phase = FailurePhase.FORWARD

    def enter(self, phase: FailurePhase) -> None:
        self.phase = phase
        self._on_phase(phase)

    def leave(self) -> FailurePhase | None:
        """The update ended (or failed): the phase it was in."""
        phase, self.phase = self.phase, None
        return phase

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _forward_pre(self, module, args):
        if self.phase is not None:
            self.enter(FailurePhase.FORWARD)

    def _forward(self, module, args, output):
        if self.phase is not None:
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._backward_start)

    def _backward_start(self, grad):
        if self.phase is not None:
            self.enter(FailurePhase.BACKWARD)

    def _step_pre(self, optimizer, args, kwargs):
        if self.phase is not None:
            self._before_step()
            self.enter(FailurePhase.OPTIMIZER)

    def _step_post(self, optimizer, args, kwargs):
        # only an update's step moves tau: found by review, a checkpoint save of an optimizer with
        # no state (plain SGD) calls `step()` between updates (DCP's `_init_optim_state`), and tau
        # ran one ahead, so a failure in the next update's forward was taken for one after its step
        if self.phase is not None:
            self._after_step()


def _first_grad_tensor(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for item in output:
            t = _first_grad_tensor(item)
            if t is not None:
                return t
    return None
