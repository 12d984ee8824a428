"""Vocabulary of the recovery protocol: rank phases, failure phases, recovery actions.

Plain enums with string values so that traces, the TLA+ spec and the Python table share
one spelling of every name.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Where one rank's recovery machine stands."""

    TRAIN = "Train"
    OBSERVE = "Observe"
    GUARD = "Guard"
    AGREE = "Agree"
    REPLACE = "Replace"
    REBIND = "Rebind"
    VALIDATE = "Validate"
    RESUME = "Resume"
    REJECT = "Reject"


class FailurePhase(StrEnum):
    """Where in an optimizer update a failure struck (the paper's phi)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMMITTED = "committed"

    @classmethod
    def parse(cls, text: str) -> FailurePhase:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown failure phase {text!r}; expected one of: {names}") from None


class RecoveryAction(StrEnum):
    """What the recovery envelope may prescribe for a failure."""

    PRESERVE = "preserve"  # L1: keep S_app, rebuild communicators, rebind, resume at F
    REJECT = "reject"  # L2: fail-stop; the supervisor restores the last verified checkpoint
    REWIND = "rewind"  # L1': discard the interrupted update, rebuild every group, re-run it from F
    REPLACE = "replace"  # a lost rank's position taken by a spare: rebuild the world, re-run F+1 (also with
    # nobody lost, under membership: the control plane failed on a rank while every process lived)
    SHRINK = "shrink"  # a lost rank's replica group leaves (Config.on_loss): a smaller world re-runs F+1

    @classmethod
    def _missing_(cls, value: object) -> RecoveryAction | None:
        # envelope files, traces and campaign summaries written before the rename say "restart"
        return cls.REJECT if value == "restart" else None
