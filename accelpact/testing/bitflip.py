"""Test-only silent data corruption: one bit of one rank's Adam `exp_avg` flipped at a chosen
update's committed boundary, after its optimizer step, before the boundary commits. Installed by
the drill as an `UpdateListener` (the runtime never knows), not a fault kind: a fault plan's
faults are communication failures the protocol detects at once, this one only a digest finds."""

from __future__ import annotations

import logging

import torch

from ..fsm.phases import FailurePhase

log = logging.getLogger("accelpact.testing")


class BitFlip:
    """Flip bit `bit` of element 0 of the first parameter's `exp_avg` on `rank` at update `update`."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, rank: int, update: int, bit: int = 0):
        self.optimizer, self.rank, self.update, self.bit = optimizer, rank, update, bit
        self.fired = False

    def on_phase(self, update: int, phase: FailurePhase) -> None:
        if self.fired or update != self.update or phase is not FailurePhase.COMMITTED:
            return
        param = self.optimizer.param_groups[0]["params"][0]
        value = self.optimizer.state[param]["exp_avg"]
        local = value.to_local() if hasattr(value, "to_local") else value
        flat = local.detach().reshape(-1)
        word = flat[:1].view(torch.int32)  # float32 state: the bits of element 0, in place
        word ^= 1 << self.bit
        self.fired = True
        log.warning("flipped bit %d of exp_avg[0] on rank %d at update %d", self.bit, self.rank, update)

    def probe_order(self, labels: list[str]) -> list[str]:
        return labels

    def before_probe(self, label: str) -> bool:
        return True
