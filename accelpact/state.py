"""Capture and compare the application state S_app of one rank, bit for bit.

"State preserved" means: every local parameter shard, every optimizer tensor (moments, step),
the optimizer step counter, every RNG kind and the data cursor are bitwise equal to those of an
uninterrupted run. `capture` copies them; `diff` names what differs; `restore` puts a capture
into a freshly built job of the same shard shapes (a reference that changes its world midway).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    if callable(to_local):  # DTensor (FSDP2): compare this rank's shard
        t = to_local()
    return t.detach().clone()


def capture(
    model: nn.Module, optimizer: torch.optim.Optimizer, data_state: Any = None, **extra: Any
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, p in model.named_parameters():
        state[f"param/{name}"] = _local(p)
    for name, b in model.named_buffers():  # running statistics, counters: state a Rewind must put back too
        state[f"buffer/{name}"] = _local(b)
    opt = optimizer.state_dict()
    for idx, per_param in opt["state"].items():
        for key, value in per_param.items():
            state[f"optim/{idx}/{key}"] = _local(value) if isinstance(value, torch.Tensor) else value
    state["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["rng/cuda"] = torch.cuda.get_rng_state_all()
    state["rng/numpy"] = np.random.get_state()
    state["rng/python"] = random.getstate()
    if data_state is not None:
        state["data/cursor"] = data_state.state_dict()
    for key, value in extra.items():
        state[f"extra/{key}"] = value
    return state


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys whose values are not bitwise equal (or present on one side only)."""
    out = sorted(set(a) ^ set(b))
    out += [k for k in sorted(set(a) & set(b)) if not same(a[k], b[k])]
    return out


def categories(keys: list[str]) -> dict[str, int]:
    """How many mismatches per state kind (param, optim, rng, data, extra)."""
    counts: dict[str, int] = {}
    for k in keys:
        counts[k.split("/")[0]] = counts.get(k.split("/")[0], 0) + 1
    return counts


def restore(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, data_state: Any = None) -> None:
    """Put `capture`'s values back into `model` (same local shard shapes, any mesh), a fresh
    `optimizer` of the same parameters, the RNGs and `data_state` (its `load_state_dict`)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if callable(getattr(p, "to_local", None)) else p
            local.copy_(state[f"param/{name}"])
        for name, b in model.named_buffers():  # a capture of an older layout without them restores none
            if f"buffer/{name}" in state:
                (b.to_local() if callable(getattr(b, "to_local", None)) else b).copy_(state[f"buffer/{name}"])
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith("optim/"):
            _, index, name = key.split("/", 2)
            per_param.setdefault(int(index), {})[name] = value
    for index, entries in per_param.items():
        p = params[index]
        optimizer.state[p] = {name: _like(p, value) for name, value in entries.items()}
    torch.set_rng_state(state["rng/torch"])
    np.random.set_state(state["rng/numpy"])
    random.setstate(state["rng/python"])
    if data_state is not None and "data/cursor" in state:
        data_state.load_state_dict(state["data/cursor"])


def _like(p: torch.Tensor, value: Any) -> Any:
    """An optimizer value as the optimizer keeps it for `p`: a DTensor on p's mesh where p is one
    and the value is shaped like its shard, else a copy."""
    if not isinstance(value, torch.Tensor):
        return value
    if callable(getattr(p, "to_local", None)) and value.dim() > 0:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(value.clone(), p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())
    return value.clone()
