"""Model and optimizer tensors through torch.distributed.checkpoint (DCP), every rank its shards.

``get_state_dict`` / ``set_state_dict`` hide the wrapper (FSDP1, FSDP2, DDP, plain module): the
same code saves sharded DTensors / ShardedTensors or replicated tensors (DCP de-duplicates
those), and loads into whatever sharding the freshly built model has. Loading goes through DCP's
own readers, which unpickle its ``.metadata`` and non-tensor entries: the manager only calls
:func:`load_shards` on a directory whose every byte has already been verified.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .collective import Comm
from .errors import CheckpointLoadError, CheckpointSaveError


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    optims = [] if optimizer is None else [optimizer]
    model_sd, optim_sd = get_state_dict(model, optims)
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    return state


@contextmanager
def _single_process_quiet(comm: Comm) -> Iterator[None]:
    """DCP warns that it 'assumes' a single process; without a process group that is the intent."""
    with warnings.catch_warnings():
        if not comm.enabled:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_shards(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, comm: Comm
) -> set[str]:
    """Collective DCP save into ``path`` (fsynced); returns the storage files DCP's metadata references."""
    writer = FileSystemWriter(os.fspath(path), sync_files=True, overwrite=False)
    try:
        with _single_process_quiet(comm):
            metadata = dcp.save(
                _state(model, optimizer), storage_writer=writer, process_group=comm.group, no_dist=not comm.enabled
            )
    except CheckpointException as exc:  # a BaseException: `except Exception` would let it escape
        # DCP gathers every rank's failure and raises it on every rank
        raise CheckpointSaveError(f"DCP save into {path} failed: {_dcp_failures(exc)}", agreed=True) from exc
    storage = getattr(metadata, "storage_data", None) or {}
    return {getattr(info, "relative_path", "") for info in storage.values()} - {""}


def load_shards(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, comm: Comm
) -> None:
    """Collective DCP load from a verified ``path`` into the live (already sharded) model/optimizer."""
    state = _state(model, optimizer)
    try:
        with _single_process_quiet(comm):
            dcp.load(state, storage_reader=FileSystemReader(os.fspath(path)), process_group=comm.group,
                     no_dist=not comm.enabled)
    except CheckpointException as exc:  # a BaseException: `except Exception` would let it escape
        raise CheckpointLoadError(f"DCP load from {path} failed: {_dcp_failures(exc)}") from exc
    set_state_dict(
        model,
        [] if optimizer is None else [optimizer],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", {}),
    )


def _dcp_failures(exc: CheckpointException) -> str:
    """DCP's per-rank failures as one line: 'rank r: Type: message; ...'."""
    failures = getattr(exc, "failures", None) or {}
    parts = []
    for rank, err in sorted(failures.items()):
        if isinstance(err, tuple) and err and isinstance(err[0], BaseException):
            err = err[0]  # DCP keeps (exception, its stack summary): the exception says what failed
        parts.append(f"rank {rank}: {type(err).__name__}: {err}")
    return "; ".join(parts) or str(exc)
