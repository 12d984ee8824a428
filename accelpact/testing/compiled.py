"""A compiled region that issues a collective on the model's mesh, as a user's
``torch.compile``d tensor-parallel block or DTensor redistribution does: after every update the
drill calls it and records what it returned and how many graphs Dynamo has compiled.

Why: Dynamo guards such a region on the mesh's group names. While a replacement got a new name,
the region recompiled after every recovery, and after ``recompile_limit`` recoveries it ran
eagerly for the rest of the job. A replacement keeps its predecessor's name (`comm.naming`), so
the graph compiled before the first fault must still be the only one after the last.
"""

from __future__ import annotations

from typing import Any

import torch


class CompiledProbe:
    """``all_reduce(rank, "sum")`` over dimension 0 of `mesh`, compiled once (Dynamo's eager
    backend: the guards are Dynamo's whatever the backend, and no C++ compiler is needed)."""

    def __init__(self, mesh: Any) -> None:
        import torch.distributed._functional_collectives as funcol

        self.mesh = mesh
        self.calls: list[dict[str, int]] = []

        def region(x: torch.Tensor) -> torch.Tensor:
            return funcol.all_reduce(x * 1, "sum", (self.mesh, 0))

        self._region = torch.compile(region, backend="eager")

    def __call__(self, rank: int) -> None:
        from torch._dynamo.utils import counters

        value = int(self._region(torch.tensor([rank], dtype=torch.int64)).item())
        self.calls.append({"sum": value, "graphs": int(counters["stats"]["unique_graphs"])})


def fsdp2_mesh(model: torch.nn.Module) -> Any:
    """The DeviceMesh FSDP2's root unit shards on (the one the rebind plans rewrite)."""
    return model._get_fsdp_state()._fsdp_param_group.mesh_info.mesh
