"""Real faults on real groups at (update, phase, rank): skip, late, kill."""

from .inject import InjectedFault, perform
from .plan import Fault, FaultKind, FaultPlan

__all__ = ["Fault", "FaultKind", "FaultPlan", "InjectedFault", "perform"]
