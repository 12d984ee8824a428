"""The runtime: attach, the guarded update boundary, and the recovery executor."""

from .report import RecoveryReport
from .runtime import Runtime, UnsupportedModelError, attach

__all__ = ["RecoveryReport", "Runtime", "UnsupportedModelError", "attach"]
