"""isolate_buckets: a late all-reduce from an interrupted backward must not reach the re-run.

The race this closes (seen once in CI, in test_discard's small-bucket DDP world): the bucket
all-reduces an interrupted backward launched are still in flight when the update is re-run; one
that completes during the re-run's backward writes its stale result into the bucket buffer the
re-run is filling. Its timing cannot be forced on a real communicator, so the test stages it: the
interrupted backward's all-reduces run but their completion is withheld (they stay in flight),
and in the middle of the re-run's backward they "land": NaN is written into the tensors they were
given and only then are they completed, as a late collective would. With isolation the re-run must
still be bitwise equal to the uninterrupted run, and finished buffers must be reused while
unfinished ones never are; with torch's own in-place ``allreduce_hook`` (the built-in path's
memory behaviour, in Python where the test can see the tensors) it must diverge. A 3-rank world
checks that isolation changes no bit of training (the pre-division by 3 is inexact, so a ``div``
where the reducer uses ``mul`` would show).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from accelpact.checkpoint.appstate import capture_rng_state, restore_rng_state
from accelpact.runtime.ddp_buckets import BucketIsolationError, is_isolated, isolate_buckets
from accelpact.runtime.discard import discard_partial_update, partial_state
from accelpact.state import capture, diff
from accelpact.testing.spawn import run_world
from accelpact.workloads import SyntheticTokens, TinyDecoder, make_adam, seed_everything, stochastic_update

SEED = 5
UPDATES = 3  # update 2 is interrupted in backward and re-run


class InjectedFault(RuntimeError):
    pass


def _job(hook: str) -> tuple[nn.Module, torch.optim.Optimizer, SyntheticTokens]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    seed_everything(SEED)
    model = DistributedDataParallel(TinyDecoder(n_layers=2, seed=SEED), bucket_cap_mb=0.01)
    if hook == "isolated":
        isolate_buckets(model)
    elif hook == "in-place":
        model.register_comm_hook(None, allreduce_hook)
    data = SyntheticTokens(model.module.vocab, 8, 2, seed=SEED, shard=dist.get_rank())
    return model, make_adam(model), data


def _on_first_block_grad(model: nn.Module, action: Any) -> Any:
    """Run ``action`` in backward once the first block's output gradient arrives: the head's and
    the second block's buckets have been launched by then, the first block's and the embeddings' not."""
    def hook_output(_module: nn.Module, _args: Any, output: torch.Tensor) -> None:
        output.register_hook(action)

    return model.module.layers[0].register_forward_hook(hook_output)


class _Recorder:
    """Stands in for ``dist.all_reduce``: records the tensors handed to it; with ``hold``, the
    all-reduce runs but its future is withheld (an all-reduce still in flight) until ``land``."""

    def __init__(self) -> None:
        self.original = dist.all_reduce
        self.tensors: list[torch.Tensor] = []
        self.held: list[torch.futures.Future] = []
        self.hold = False

    def __call__(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.tensors.append(tensor)
        work = self.original(tensor, *args, **kwargs)
        if not self.hold:
            return work
        work.wait()
        pending: torch.futures.Future = torch.futures.Future()
        self.held.append(pending)

        class _InFlight:
            def get_future(self) -> torch.futures.Future:
                return pending

        return _InFlight()

    def take(self) -> list[torch.Tensor]:
        out, self.tensors = self.tensors, []
        return out

    def land(self, tensors: list[torch.Tensor]) -> None:
        """What the held all-reduces do when they complete late: write their result, then finish."""
        for tensor in tensors:
            tensor.fill_(float("nan"))
        for pending, tensor in zip(self.held, tensors, strict=True):
            pending.set_result([tensor])
        self.held = []


def _late_completion_world(rank: int, world_size: int, hook: str) -> dict[str, Any]:
    model, optimizer, data = _job(hook)
    for _ in range(UPDATES):
        stochastic_update(model, optimizer, data)
    reference = capture(model, optimizer, data)

    model, optimizer, data = _job(hook)
    stochastic_update(model, optimizer, data)
    rng, cursor = capture_rng_state(), copy.deepcopy(data.state_dict())
    recorder = _Recorder()

    def fail(_grad: torch.Tensor) -> None:
        raise InjectedFault("interrupted backward")

    dist.all_reduce = recorder
    try:
        recorder.hold = True  # update 2's bucket all-reduces are still in flight when it fails
        handle = _on_first_block_grad(model, fail)
        try:
            stochastic_update(model, optimizer, data)
            raise AssertionError("the fault did not fire")
        except InjectedFault:
            pass
        finally:
            handle.remove()
            recorder.hold = False
        stale = recorder.take()
        discard_partial_update(model, optimizer)
        restore_rng_state(rng)
        data.load_state_dict(cursor)
        # the re-run of update 2; the stale all-reduces complete in the middle of its backward
        handle = _on_first_block_grad(model, lambda _grad: recorder.land(stale))
        stochastic_update(model, optimizer, data)
        handle.remove()
        rerun = recorder.take()
        for _ in range(2, UPDATES):
            stochastic_update(model, optimizer, data)
        later = recorder.take()
    finally:
        dist.all_reduce = recorder.original
    state = capture(model, optimizer, data)
    ids = {name: {id(t) for t in tensors} for name, tensors in (("stale", stale), ("rerun", rerun), ("later", later))}
    return {"stale": len(stale), "isolated": is_isolated(model), "partial": partial_state(model, optimizer),
            "mismatches": diff(state, reference), "compared": len(state),
            "rerun_reuses_stale": bool(ids["stale"] & ids["rerun"]), "later_reuses_rerun": ids["later"] == ids["rerun"]}


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_late_stale_allreduce_cannot_touch_an_isolated_rerun() -> None:
    (got,) = run_world(_late_completion_world, 1, "isolated", timeout_s=90)
    assert got["isolated"]
    assert got["stale"] >= 2, got  # bucket all-reduces were in flight when the backward failed
    assert got["partial"] == []
    assert got["compared"] > 0 and got["mismatches"] == [], got["mismatches"][:8]
    # buffers of finished all-reduces are reused (no page faults per update); unfinished ones never
    assert got["later_reuses_rerun"] and not got["rerun_reuses_stale"], got


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_late_stale_allreduce_corrupts_an_in_place_rerun() -> None:
    """The control: the same late write breaks a re-run whose buckets are all-reduced in place."""
    (got,) = run_world(_late_completion_world, 1, "in-place", timeout_s=90)
    assert not got["isolated"] and got["stale"] >= 2
    assert any(key.startswith("param/") for key in got["mismatches"]), got


def _parity_world(rank: int, world_size: int) -> dict[str, Any]:
    out = {}
    for hook in ("built-in", "isolated"):
        model, optimizer, data = _job(hook)
        for _ in range(UPDATES):
            stochastic_update(model, optimizer, data)
        out[hook] = capture(model, optimizer, data)
    return {"mismatches": diff(out["built-in"], out["isolated"]), "compared": len(out["isolated"])}


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_isolation_is_bitwise_the_builtin_allreduce_with_three_replicas() -> None:
    for rank, got in enumerate(run_world(_parity_world, 3, timeout_s=120)):
        assert got["compared"] > 0 and got["mismatches"] == [], (rank, got["mismatches"][:8])


def _refusal_world(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    out: dict[str, Any] = {}
    model = DistributedDataParallel(nn.Linear(2, 2))
    isolate_buckets(model)
    isolate_buckets(model)  # idempotent
    out["isolated"] = is_isolated(model)
    users = DistributedDataParallel(nn.Linear(2, 2))
    users.register_comm_hook(None, allreduce_hook)
    try:
        isolate_buckets(users)
    except BucketIsolationError as exc:
        out["refused"] = str(exc)
    builtin = DistributedDataParallel(nn.Linear(2, 2))
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    try:
        isolate_buckets(builtin)
    except BucketIsolationError as exc:
        out["refused_builtin"] = str(exc)
    try:
        isolate_buckets(nn.Linear(2, 2))
    except TypeError as exc:
        out["type"] = str(exc)
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_isolation_refuses_models_it_cannot_isolate() -> None:
    (got,) = run_world(_refusal_world, 1, timeout_s=45)
    assert got["isolated"]
    assert "allreduce_hook" in got["refused"] and "Rewind" in got["refused"]
    assert "refused a communication hook" in got["refused_builtin"]
    assert "Linear" in got["type"]


def _release(rank: int, world_size: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from accelpact.runtime.ddp_buckets import isolate_buckets, release_buckets

    model = DistributedDataParallel(nn.Linear(4, 4), process_group=dist.new_group(list(range(world_size))))
    isolate_buckets(model)
    for _ in range(2):
        model(torch.ones(2, 4)).sum().backward()
    freed = release_buckets(model)
    try:  # why the hook cannot be removed: DDP takes one hook, once, and has no way to unregister it
        model.register_comm_hook(None, lambda state, bucket: None)
        again = "accepted"
    except RuntimeError as exc:
        again = str(exc)
    return {"freed": freed, "again": again, "released_twice": release_buckets(model)}


@pytest.mark.timeout(60)
def test_close_frees_the_hooks_buffers_and_ddp_cannot_unregister_a_hook():
    for out in run_world(_release, 2, timeout_s=45):
        assert out["freed"] >= 1 and out["released_twice"] == 0
        assert "can only be called once" in out["again"]
