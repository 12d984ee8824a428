"""Real faults on real groups at (update, phase, rank): skip, late, kill.

Drill tooling: nothing in the runtime imports this package; `accelpact.attach` installs a
`FaultInjector` from outside when a fault plan is given."""

from .inject import InjectedFault, perform
from .injector import FaultInjector
from .plan import Fault, FaultKind, FaultPlan

__all__ = ["Fault", "FaultInjector", "FaultKind", "FaultPlan", "InjectedFault", "perform"]
