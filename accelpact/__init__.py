"""AccelPact: keep sharded PyTorch training alive through communication failures, in memory.

    rt = accelpact.attach(model, optimizer, data_state=None, config=accelpact.Config())
    for batch in loader:
        with rt.update():
            loss = model(batch).sum(); loss.backward()
            optimizer.step(); optimizer.zero_grad()
"""

from .config import Config
from .errors import (
    EXIT_BUDGET_EXCEEDED,
    EXIT_FENCED,
    EXIT_REJECTED,
    AccelPactError,
    CheckpointError,
    CollectiveAbandoned,
    ConfigError,
    ControlPlaneError,
    DeviceWorkFailed,
    RankFenced,
    RankLeft,
    RebindError,
    RecoveryRejected,
    RestartBudgetExceeded,
    SpareReleased,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "EXIT_BUDGET_EXCEEDED",
    "EXIT_FENCED",
    "EXIT_REJECTED",
    "AccelPactError",
    "CheckpointError",
    "CollectiveAbandoned",
    "Config",
    "ConfigError",
    "ControlPlaneError",
    "DeviceWorkFailed",
    "RankFenced",
    "RankLeft",
    "RebindError",
    "RecoveryRejected",
    "RestartBudgetExceeded",
    "Runtime",
    "SpareReleased",
    "UnsupportedModelError",
    "__version__",
    "attach",
    "init_process_group",
]


def __getattr__(name: str):
    # The runtime imports torch.distributed internals; load it on first use so that the pure
    # parts (fsm, model checking, CLI help) stay importable and fast.
    if name in ("attach", "Runtime", "RecoveryRecord"):
        from . import runtime

        return getattr(runtime, name)
    if name == "init_process_group":
        from .launch import init_process_group

        return init_process_group
    raise AttributeError(f"module 'accelpact' has no attribute {name!r}")
