"""Verified, sharded checkpoints for the Restart (L2) path.

Failures AccelPact cannot preserve in memory are rejected fail-stop; torchrun restarts the job
and :class:`CheckpointManager` restores the newest checkpoint that is published (COMMITTED) and
whose every byte matches its manifest, falling back past anything torn or tampered.
"""

from .appstate import AppState, Stateful, capture_rng_state, restore_rng_state
from .attempts import AttemptLog, AttemptRecord, check_restart_budget, restart_count, updates_replayed
from .errors import (
    CheckpointDurabilityError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointLayoutError,
    CheckpointLoadError,
    CheckpointSaveError,
    ManifestError,
    NoVerifiedCheckpointError,
    Refusal,
    RestartBudgetExceeded,
    agreed_failure,
)
from .manager import CheckpointManager, RestoreResult, SaveResult
from .manifest import FileEntry, Manifest, parse_manifest
from .verify import Verdict, verify_step_dir

__all__ = [
    "AppState",
    "AttemptLog",
    "AttemptRecord",
    "CheckpointDurabilityError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointLayoutError",
    "CheckpointLoadError",
    "CheckpointManager",
    "CheckpointSaveError",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "NoVerifiedCheckpointError",
    "Refusal",
    "RestartBudgetExceeded",
    "RestoreResult",
    "SaveResult",
    "Stateful",
    "Verdict",
    "agreed_failure",
    "capture_rng_state",
    "check_restart_budget",
    "parse_manifest",
    "restart_count",
    "restore_rng_state",
    "updates_replayed",
    "verify_step_dir",
]
