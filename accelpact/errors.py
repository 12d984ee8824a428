"""Errors and exit codes users and supervisors see."""

from __future__ import annotations

#: Exit code of every rank when a recovery is rejected (fail-stop, L2). torchrun restarts the
#: group; the value is EX_TEMPFAIL from sysexits.h: "temporary failure, retry later".
EXIT_REJECTED = 75


class ConfigError(ValueError):
    """A bad setting: names the field (or environment variable) and what is wrong with it."""


class RecoveryRejected(SystemExit):
    """Raised on every rank when a recovery ends in Reject and `Config.on_reject` is "raise".

    It is a SystemExit carrying EXIT_REJECTED, so an uncaught one ends the process with the
    documented code; tests and embedding code can catch it.
    """

    def __init__(self, reasons: tuple[str, ...], evidence_path: str | None = None):
        super().__init__(EXIT_REJECTED)
        self.reasons = reasons
        self.evidence_path = evidence_path

    def __str__(self) -> str:
        return "recovery rejected: " + "; ".join(self.reasons)
