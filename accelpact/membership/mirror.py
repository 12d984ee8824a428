"""What a wrapper's constructor does with its peers, done again by the survivors for a spare.

A spare builds its wrappers by running the user's script; a constructor that runs collectives
would wait for peers that built theirs long ago, and a constructor that sets up per-wrapper state
leaves the spare's wrapper unlike theirs. DDP does both (torch 2.13,
``DistributedDataParallel.__init__`` with its default ``init_sync=True``):

- it verifies parameter shapes across the group and broadcasts parameters (and buffers) from the
  group's rank 0: each survivor runs the same two calls on the rebuilt group, keeping its own
  values (the broadcast's source may be the spare, whose fresh values must reach nobody; its
  state comes from the verified transfer afterwards);
- it builds a fresh reducer whose gradient buckets follow the initial parameter order, while a
  survivor's reducer has rebuilt its buckets in the order gradients arrived. Two members of one
  bucketed all-reduce with different bucket layouts add up different parameters elementwise,
  silently (measured: the replaced rank's replica pair diverged). Each survivor builds its reducer
  afresh (`fresh_reducer`) so that both sides start from the same layout and rebuild together.

FSDP2's ``fully_shard`` and FSDP1 with given process groups run no collective at construction:
nothing to mirror. Assumed: DDP built with ``init_sync=True`` (the default). A DDP with buffers and
their forward sync off is not offered a Replace (`unmirrorable`); another construction makes the
spare and the survivors disagree, which the join timeout turns into a Reject."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.utils import _sync_module_states, _verify_param_shape_across_processes
from torch.nn.parallel import DistributedDataParallel


def ddp_modules(model: nn.Module) -> list[DistributedDataParallel]:
    return [m for m in model.modules() if isinstance(m, DistributedDataParallel)]


def unmirrorable(model: nn.Module) -> str:
    """Why the survivors cannot mirror a DDP constructor of `model` for a spare ("" when they can).
    torch 2.13 syncs buffers at construction unless `broadcast_buffers=False` was given, also with
    `forward_sync_buffers=False`, and the object keeps only the latter: with buffers and forward
    sync off, whether the spare's constructor broadcasts them cannot be told, and a guess that is
    wrong mismatches its collectives (found by review)."""
    for ddp in ddp_modules(model):
        if not ddp.forward_sync_buffers and any(True for _ in ddp.module.buffers()):
            return ("a DDP model with buffers and their forward sync off (broadcast_buffers=False or "
                    "forward_sync_buffers=False): whether its constructor synced them cannot be told, so a "
                    "spare's constructor cannot be mirrored")
    return ""


def mirror_ddp_construction(ddp: DistributedDataParallel, group: dist.ProcessGroup) -> None:
    """DDP's constructor's collectives on `group`, this rank's parameters and buffers unchanged."""
    module = ddp.module
    live = [*module.parameters(), *module.buffers()]
    keep = [t.detach().clone() for t in live]
    parameters, _ = ddp._build_params_for_reducer()
    _verify_param_shape_across_processes(group, parameters)
    _sync_module_states(module=module, process_group=group, broadcast_bucket_size=ddp.broadcast_bucket_size, src=0,
                        params_and_buffers_to_ignore=ddp.parameters_to_ignore,
                        broadcast_buffers=bool(ddp.forward_sync_buffers))
    with torch.no_grad():
        for tensor, saved in zip(live, keep):
            tensor.copy_(saved)


def fresh_reducer(ddp: DistributedDataParallel) -> None:
    """Build `ddp`'s reducer as its constructor does (initial buckets, first-iteration state), on
    its current process group, with the same comm hooks; the old reducer, dropped, removes its
    autograd hooks."""
    if getattr(ddp, "mixed_precision", None) is not None:
        raise RuntimeError("a DDP with mixed precision cannot be given a fresh reducer here")
    hooks = list(ddp._comm_hooks)  # registered on the old reducer (AccelPact's bucket isolation, say)
    parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
    names = ddp._build_debug_param_to_name_mapping(parameters)
    ddp._ddp_init_helper(parameters, expect_sparse_gradient, names, ddp.static_graph)
    ddp._has_rebuilt_buckets = False
    ddp._comm_hooks = []
    for hook, state in hooks:
        ddp.register_comm_hook(state, hook)
