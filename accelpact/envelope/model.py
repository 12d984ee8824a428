"""The recovery envelope: observation key K = <platform, resource profile, failure phase,
objective> mapped to the recovery actions qualified for it. Pure: no torch.

Qualification is empirical (seed 000: the same action works on one accelerator stack and kills
the process on another), so the envelope is a data table with the evidence for each row, and a
key that is not in the table is refused with a clear error rather than guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import AccelPactError
from ..fsm.phases import FailurePhase, RecoveryAction
from ..timeouts import DerivedTimeouts

OBJECTIVE_BITWISE = "bitwise-continuation"
PROFILES = ("fsdp1-hsdp", "fsdp2-hsdp", "ddp")
#: What a probe may have needed to pass, and what a run must have for the action to stand: an
#: action qualified only under a condition the running config lacks is not qualified for it.
CONDITIONS = {"step_copy": "a pre-step copy (Config.step_copy=True)"}
#: Where a lost rank's replacement by a spare was measured bitwise here (tests/test_spares.py):
#: CPU/gloo with FSDP1 HYBRID_SHARD, FSDP2 HSDP and DDP. Never on NCCL (no device here).
REPLACE_MEASURED = {("cpu-gloo", "fsdp1-hsdp"), ("cpu-gloo", "fsdp2-hsdp"), ("cpu-gloo", "ddp")}


class UnknownObservationKey(AccelPactError, LookupError):
    """No envelope row covers this observation key; nothing may be guessed."""


@dataclass(frozen=True, order=True)
class ObservationKey:
    platform: str  # e.g. "cpu-gloo", "cuda-nccl"
    resource_profile: str  # e.g. "fsdp2-hsdp"
    failure_phase: FailurePhase
    objective: str = OBJECTIVE_BITWISE

    def __str__(self) -> str:
        return f"<{self.platform}, {self.resource_profile}, {self.failure_phase}, {self.objective}>"


@dataclass(frozen=True)
class EnvelopeRow:
    key: ObservationKey
    actions: tuple[RecoveryAction, ...]  # preferred first
    evidence: str
    #: (action, conditions) for each action that passed its probe only under those conditions
    #: (names in `CONDITIONS`; e.g. DDP's Rewind in backward passed only with a pre-step copy)
    requires: tuple[tuple[RecoveryAction, tuple[str, ...]], ...] = ()

    def needs(self, action: RecoveryAction) -> tuple[str, ...]:
        """The conditions under which `action` was qualified (empty: none)."""
        return next((conditions for a, conditions in self.requires if a is action), ())


class Envelope:
    def __init__(self, rows: Iterable[EnvelopeRow], *, timeouts: DerivedTimeouts | None = None):
        #: timeouts `accelpact qualify` measured (lower bounds for a runtime's "auto"); None: none
        self.timeouts = timeouts
        self._rows: dict[ObservationKey, EnvelopeRow] = {}
        for row in rows:
            if row.key in self._rows:
                raise ValueError(f"duplicate envelope row for {row.key}")
            if not row.actions:
                raise ValueError(f"envelope row {row.key} qualifies no action")
            self._rows[row.key] = row

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self) -> tuple[EnvelopeRow, ...]:
        return tuple(self._rows[k] for k in sorted(self._rows))

    def lookup(self, key: ObservationKey) -> EnvelopeRow:
        try:
            return self._rows[key]
        except KeyError:
            known_platforms = sorted({k.platform for k in self._rows})
            known_profiles = sorted({k.resource_profile for k in self._rows})
            raise UnknownObservationKey(
                f"no recovery envelope entry for K={key}; qualified platforms: {known_platforms}, "
                f"profiles: {known_profiles}. Refusing to guess a recovery action."
            ) from None

    def qualified(self, key: ObservationKey) -> tuple[RecoveryAction, ...]:
        return self.lookup(key).actions

    def permits(self, key: ObservationKey, action: RecoveryAction) -> bool:
        return action in self.qualified(key)


def _default_rows() -> Iterable[EnvelopeRow]:
    evidence = {
        "cpu-gloo": "measured here: torch 2.13.0 CPU/gloo, group retired after a real timeout, "
        "rebuilt and rebound, bitwise equal to an uninterrupted run (tests/test_rebind_*.py)",
        "cuda-nccl": "seed 000: A100/NCCL 2.21.5 destroy+recreate after an incomplete collective "
        "timeout succeeded on five fresh pairs; re-qualify on your platform",
    }
    for platform, note in evidence.items():
        for profile in PROFILES:
            replace = (RecoveryAction.REPLACE,) if (platform, profile) in REPLACE_MEASURED else ()
            for phase in FailurePhase:
                if phase is FailurePhase.COMMITTED:
                    actions = (RecoveryAction.PRESERVE, *replace, RecoveryAction.REJECT)
                    why = note
                else:
                    actions = (*replace, RecoveryAction.REJECT)
                    why = "uncommitted compute: partial gradients or a partial step; fail-stop (L2)"
                if replace:
                    why += "; replace: a lost rank taken over by a spare, measured here (tests/test_spares.py)"
                yield EnvelopeRow(ObservationKey(platform, profile, phase), actions, why)


DEFAULT_ENVELOPE = Envelope(_default_rows())


def permissive_envelope(platform: str, profile: str) -> Envelope:
    """Every action allowed for one platform and profile: what the qualification probes run under,
    so that what passes is measured rather than assumed. Never a default."""
    rows = []
    for phase in FailurePhase:
        if phase is FailurePhase.COMMITTED:
            actions = (RecoveryAction.PRESERVE, RecoveryAction.REPLACE, RecoveryAction.REJECT)
        else:
            actions = (RecoveryAction.REWIND, RecoveryAction.REPLACE, RecoveryAction.REJECT)
        rows.append(EnvelopeRow(ObservationKey(platform, profile, phase), actions, "qualification run: unqualified"))
    return Envelope(rows)
