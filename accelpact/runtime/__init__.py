"""The runtime: attach, the guarded update boundary, and the recovery executor."""

from ..errors import UnsupportedModelError
from .attach import attach
from .history import RecoveryRecord
from .runtime import Runtime

__all__ = ["RecoveryRecord", "Runtime", "UnsupportedModelError", "attach"]
