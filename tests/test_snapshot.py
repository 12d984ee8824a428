"""BoundarySnapshot and StepCopy: what Rewind puts back must be bitwise what was there, in place."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from accelpact.runtime.snapshot import BoundarySnapshot, StepCopy
from accelpact.state import capture, diff
from accelpact.testing.spawn import run_world
from accelpact.workloads import SyntheticTokens, TinyDecoder, make_adam, next_token_loss, seed_everything

# --------------------------------------------------------------------------------------------
# helpers


def _draws(data: SyntheticTokens | None) -> dict[str, Any]:
    """What an update may draw: every RNG kind (Gaussian caches included) and the next batch."""
    out: dict[str, Any] = {
        "torch": torch.rand(4),
        "torch_normal": torch.randn(3),
        "numpy": np.random.rand(3),
        "numpy_normal": np.random.randn(1),  # legacy RandomState caches the second Gaussian
        "python": random.random(),
        "python_gauss": random.gauss(0.0, 1.0),  # caches gauss_next
    }
    if data is not None:
        out["batch"] = data.next_batch()
        out["cursor"] = data.state_dict()
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


class _AliasingLoader:
    """A loader whose state_dict() returns its live state and which keeps the dict it is given."""

    def __init__(self) -> None:
        self._state = {"cursor": 0, "epoch": 0, "order": [3, 1, 2]}

    def advance(self) -> None:
        self._state["cursor"] += 1
        self._state["order"].append(self._state["cursor"])

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = state


def _model_and_adam(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, SyntheticTokens]:
    model = TinyDecoder(vocab=32, dim=16, n_layers=2, max_seq=8, seed=seed)
    data = SyntheticTokens(vocab=32, seq_len=6, batch_size=2, seed=seed)
    return model, make_adam(model), data


def _forward_backward(model: torch.nn.Module, data: SyntheticTokens) -> None:
    torch.rand(1)  # the update consumes randomness, as dropout would
    next_token_loss(model, data.next_batch()).backward()


def _update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: SyntheticTokens) -> None:
    _forward_backward(model, data)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _pointers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    ptrs = {f"param/{n}": getattr(p, "_local_tensor", p).data_ptr() for n, p in model.named_parameters()}
    for index, per_param in enumerate(optimizer.state.values()):
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                ptrs[f"optim/{index}/{key}"] = getattr(value, "_local_tensor", value).data_ptr()
    return ptrs


# --------------------------------------------------------------------------------------------
# BoundarySnapshot


def test_restore_replays_every_rng_kind_and_the_cursor_bitwise():
    seed_everything(3)
    np.random.randn(3)  # odd count: a cached Gaussian is part of the captured state
    random.gauss(0.0, 1.0)
    data = SyntheticTokens(vocab=32, seq_len=4, batch_size=2, seed=1)
    data.next_batch()
    snapshot = BoundarySnapshot.capture(data, frontier=5)
    assert snapshot.frontier == 5 and snapshot.has_cursor and snapshot.cursor == {"seed": 1, "shard": 0, "cursor": 1}
    first = _draws(data)
    assert not _same(first, _draws(data))  # without a restore the next update draws differently
    for _ in range(2):  # one snapshot serves several rewinds of the same update
        snapshot.restore(data)
        assert _same(_draws(data), first)


def test_mutating_the_loader_after_capture_does_not_reach_the_snapshot():
    loader = _AliasingLoader()
    loader.advance()
    snapshot = BoundarySnapshot.capture(loader, frontier=1)
    loader.advance()
    loader.advance()
    assert snapshot.cursor == {"cursor": 1, "epoch": 0, "order": [3, 1, 2, 1]}
    snapshot.restore(loader)
    assert loader.state_dict() == {"cursor": 1, "epoch": 0, "order": [3, 1, 2, 1]}
    loader.advance()  # mutates the dict load_state_dict was given: must be a copy, not the snapshot's
    snapshot.restore(loader)
    assert loader.state_dict() == {"cursor": 1, "epoch": 0, "order": [3, 1, 2, 1]}


def test_without_data_state_only_rng_is_captured():
    seed_everything(0)
    snapshot = BoundarySnapshot.capture(None, frontier=0)
    assert not snapshot.has_cursor and snapshot.cursor is None
    first = _draws(None)
    snapshot.restore(None)
    assert _same(_draws(None), first)
    with pytest.raises(ValueError, match="holds no cursor"):
        snapshot.restore(SyntheticTokens(vocab=8, seq_len=2, batch_size=1))
    with pytest.raises(ValueError, match="no data_state was given"):
        BoundarySnapshot.capture(SyntheticTokens(vocab=8, seq_len=2, batch_size=1), frontier=0).restore(None)


class _OnlySaves:
    def state_dict(self) -> dict:
        return {}


def test_a_data_state_without_the_stateful_methods_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"builtins\.list .*state_dict\(\) and load_state_dict\(\).*"
                                        r"missing: state_dict, load_state_dict"):
        BoundarySnapshot.capture([1, 2, 3], frontier=0)
    with pytest.raises(TypeError, match=r"test_snapshot\._OnlySaves .*missing: load_state_dict\)"):
        BoundarySnapshot.capture(_OnlySaves(), frontier=0)
    snapshot = BoundarySnapshot.capture(_AliasingLoader(), frontier=0)
    with pytest.raises(TypeError, match="_OnlySaves"):
        snapshot.restore(_OnlySaves())


# --------------------------------------------------------------------------------------------
# StepCopy on a plain module


@pytest.mark.parametrize("prior_updates", [0, 2], ids=["first-step", "later-step"])
def test_restore_undoes_a_step_bitwise_and_in_place(prior_updates):
    seed_everything(0)
    model, optimizer, data = _model_and_adam()
    for _ in range(prior_updates):
        _update(model, optimizer, data)
    _forward_backward(model, data)
    before, pointers = capture(model, optimizer, data), _pointers(model, optimizer)
    state_objects = {id(t) for s in optimizer.state.values() for t in s.values()}
    step_copy = StepCopy().take(model, optimizer, frontier=prior_updates)
    assert step_copy.valid_for == prior_updates
    optimizer.step()
    after = capture(model, optimizer, data)
    assert diff(before, after)  # the step changed something worth undoing
    step_copy.restore(model, optimizer)
    assert diff(before, capture(model, optimizer, data)) == []
    assert _pointers(model, optimizer) == pointers
    assert {id(t) for s in optimizer.state.values() for t in s.values()} == state_objects
    if prior_updates == 0:
        assert len(optimizer.state) == 0  # Adam's lazily created state is gone: the first step re-creates it
    optimizer.step()  # gradients are still there: the same step again gives the same result
    assert diff(after, capture(model, optimizer, data)) == []


def test_restore_puts_back_replaced_objects_and_drops_what_the_step_added():
    seed_everything(0)
    model, optimizer, data = _model_and_adam()
    _update(model, optimizer, data)
    _forward_backward(model, data)
    before = capture(model, optimizer, data)
    param = optimizer.param_groups[0]["params"][0]
    exp_avg, per_param = optimizer.state[param]["exp_avg"], optimizer.state[param]
    other = optimizer.param_groups[0]["params"][1]
    other_state = optimizer.state[other]
    step_copy = StepCopy().take(model, optimizer)
    optimizer.step()
    optimizer.state[other] = dict(other_state)  # a step that replaced a per-parameter state dict
    optimizer.state[param]["exp_avg"] = torch.zeros_like(exp_avg)  # a step that replaced a tensor
    optimizer.state[param]["junk"] = torch.ones(2)  # ... and added state
    optimizer.param_groups[0]["lr"] = 1.0
    optimizer.param_groups[0]["added"] = True
    with torch.no_grad():
        param.add_(1.0)
    step_copy.restore(model, optimizer)
    assert optimizer.state[param] is per_param and per_param["exp_avg"] is exp_avg and "junk" not in per_param
    assert optimizer.state[other] is other_state
    assert optimizer.param_groups[0]["lr"] == 1e-2 and "added" not in optimizer.param_groups[0]
    assert diff(before, capture(model, optimizer, data)) == []


def test_buffers_are_allocated_once_and_hold_param_and_optimizer_bytes():
    seed_everything(0)
    model, optimizer, data = _model_and_adam()
    _update(model, optimizer, data)
    step_copy = StepCopy().take(model, optimizer)
    buffers = [b.data_ptr() for b in step_copy._buffers]
    _update(model, optimizer, data)
    step_copy.take(model, optimizer)
    assert [b.data_ptr() for b in step_copy._buffers] == buffers
    expected = sum(p.nbytes for p in model.parameters())
    expected += sum(t.nbytes for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    assert step_copy.nbytes == expected


def test_restore_refuses_without_a_valid_copy_or_with_a_reshaped_parameter():
    seed_everything(0)
    model, optimizer, _ = _model_and_adam()
    step_copy = StepCopy()
    with pytest.raises(RuntimeError, match="take\\(\\) was never called"):
        step_copy.restore(model, optimizer)
    step_copy.take(model, optimizer, frontier=0)
    step_copy.invalidate()
    assert step_copy.valid_for is None
    with pytest.raises(RuntimeError, match="invalidated"):
        step_copy.restore(model, optimizer)
    step_copy.take(model, optimizer, frontier=0)
    head = model.head.weight
    saved = head.data
    head.data = torch.zeros(3)  # as an FSDP1 flat parameter left unsharded by a failure
    with pytest.raises(RuntimeError, match="parameter 'head.weight'.*idle"):
        step_copy.restore(model, optimizer)
    head.data = saved


def _rewound_run(updates: int, rewind_at: set[int]) -> dict[str, Any]:
    seed_everything(7)
    model, optimizer, data = _model_and_adam(seed=7)
    step_copy = StepCopy()
    for frontier in range(updates):
        snapshot = BoundarySnapshot.capture(data, frontier)
        if frontier in rewind_at:  # the step ran, then the update failed: put everything back, re-run
            _forward_backward(model, data)
            step_copy.take(model, optimizer, frontier)
            optimizer.step()
            step_copy.restore(model, optimizer)
            optimizer.zero_grad(set_to_none=True)
            snapshot.restore(data)
        _update(model, optimizer, data)
    return capture(model, optimizer, data)


def test_a_rewound_update_ends_bitwise_equal_to_an_uninterrupted_run():
    reference = _rewound_run(4, set())
    assert diff(reference, _rewound_run(4, {0, 2})) == []


# --------------------------------------------------------------------------------------------
# FSDP2 (and FSDP1) in a 2-rank gloo world


def _job(framework: str, generation: int):
    from accelpact.workloads import build_hsdp_job

    return build_hsdp_job(framework, layers=2, dim=16, seq_len=6, batch_size=2, local=2, generation=generation)


def _sharded_world(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    generation = 0
    for framework in ("fsdp2", "fsdp1"):
        seed_everything(11)
        model, optimizer, data = _job(framework, generation)
        for _ in range(3):
            _update(model, optimizer, data)
        reference = capture(model, optimizer, data)

        seed_everything(11)
        model, optimizer, data = _job(framework, generation + 1)
        generation += 2
        step_copy, checks = StepCopy(), []
        for frontier in range(3):
            snapshot = BoundarySnapshot.capture(data, frontier)
            if frontier in (0, 2):  # the very first step (empty Adam state) and a later one
                _forward_backward(model, data)
                before, pointers = capture(model, optimizer, data), _pointers(model, optimizer)
                step_copy.take(model, optimizer, frontier)
                optimizer.step()
                changed = bool(diff(before, capture(model, optimizer, data)))
                step_copy.restore(model, optimizer)
                checks.append({"frontier": frontier, "changed": changed,
                               "restored": diff(before, capture(model, optimizer, data)),
                               "pointers_kept": _pointers(model, optimizer) == pointers,
                               "opt_state_entries": len(optimizer.state)})
                optimizer.zero_grad(set_to_none=True)
                snapshot.restore(data)
            _update(model, optimizer, data)
        out[framework] = {"checks": checks, "mismatches": diff(reference, capture(model, optimizer, data)),
                          "compared": len(reference), "nbytes": step_copy.nbytes,
                          "dtensor": any(hasattr(p, "_local_tensor") for p in model.parameters())}
    return out


@pytest.fixture(scope="module")
def sharded_world() -> list[dict[str, Any]]:
    return run_world(_sharded_world, 2, timeout_s=90, pg_timeout_s=30)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_sharded_step_is_undone_in_place_and_the_rewound_run_is_bitwise_equal(sharded_world, framework):
    for rank, result in enumerate(sharded_world):
        res = result[framework]
        assert res["dtensor"] == (framework == "fsdp2")
        assert res["compared"] > 0 and res["nbytes"] > 0
        assert res["mismatches"] == [], f"rank {rank}: {res['mismatches']}"
        first, later = res["checks"]
        assert first["opt_state_entries"] == 0 and later["opt_state_entries"] > 0
        for check in res["checks"]:
            assert check["changed"], check
            assert check["restored"] == [], (rank, check)
            assert check["pointers_kept"], (rank, check)


def test_module_buffers_changed_by_forward_are_restored_in_place():
    """BatchNorm's running statistics move in every training forward: a rewind that kept them
    would count the interrupted update twice."""
    from accelpact.runtime.snapshot import BoundarySnapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = [b.data_ptr() for b in model.buffers()]
    snap = BoundarySnapshot.capture(None, 0, model)
    model(torch.randn(8, 4)).sum().backward()  # the interrupted update moved the statistics
    assert not torch.equal(model[1].running_mean, before["1.running_mean"])
    snap.restore(None)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert [b.data_ptr() for b in model.buffers()] == ptrs


def test_a_buffer_forward_replaced_instead_of_updating_is_put_back():
    """`self.ema = 0.9 * self.ema + 0.1 * x` assigns a new tensor: a restore that copied into the
    old one left the module holding the interrupted update's value, counted twice by the re-run."""
    import torch

    from accelpact.runtime.module_buffers import ModuleBuffers
    from accelpact.runtime.snapshot import BoundarySnapshot

    class Ema(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(2))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self, x):
            self.ema = 0.9 * self.ema + 0.1 * x  # out of place
            self.count += 1  # in place
            return x

    model = Ema()
    index = ModuleBuffers(model)
    snap = BoundarySnapshot.capture(None, 0, model, model_buffers=index.slots())
    model(torch.ones(2))
    assert torch.equal(model.ema, torch.full((2,), 0.1)) and int(model.count) == 1
    snap.restore(None)
    assert model.ema.tolist() == [0.0, 0.0] and int(model.count) == 0
    assert index.current() == tuple(model.buffers())  # the index follows the buffer put back
    assert BoundarySnapshot.capture(None, 0, model).buffers[0][2] is model._buffers  # the walk gives slots too


def test_the_boundary_snapshot_puts_schedulers_scalers_and_the_lr_back():
    import torch

    from accelpact.runtime.rewind import schedulers_of
    from accelpact.runtime.snapshot import BoundarySnapshot

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale(torch.ones(()))  # the scaler's state exists once it has scaled a loss
    assert schedulers_of(opt) == [sched]  # found through the optimizer it drives
    snap = BoundarySnapshot.capture(None, 0, model, optimizer=opt, stateful=(sched, scaler))
    before = (sched.state_dict(), scaler.state_dict(), opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
    scaler.update(new_scale=3.0)
    assert opt.param_groups[0]["lr"] != before[2]
    snap.restore(None)
    assert (sched.state_dict(), scaler.state_dict(), opt.param_groups[0]["lr"]) == before


def test_an_update_abandoned_after_the_scaler_unscaled_reruns_bitwise_equal():
    """`scaler.step` unscales the gradients, then the optimizer's pre-hook abandons the update (a
    deferred boundary's flag > 0). The re-run must unscale its own gradients again: a scaler still
    marked "unscaled" would step with them 1024 times too large (pins torch's GradScaler internals
    that `snapshot._forget_this_steps_unscale` resets)."""
    import torch

    from accelpact.runtime.snapshot import BoundarySnapshot

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

    def job():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))  # the scaler's state exists once it has scaled a loss
        return model, opt, scaler

    def backward(model, opt, scaler):
        opt.zero_grad()
        scaler.scale(model(x).pow(2).mean()).backward()

    def update(model, opt, scaler):
        backward(model, opt, scaler)
        scaler.step(opt)
        scaler.update()

    reference = job()
    update(*reference)
    model, opt, scaler = job()
    snap = BoundarySnapshot.capture(None, 0, model, optimizer=opt, stateful=(scaler,))
    backward(model, opt, scaler)
    scaler.unscale_(opt)  # what scaler.step does before the optimizer's pre-hook abandons the update
    snap.restore(None)
    update(model, opt, scaler)
    for got, want in zip(model.parameters(), reference[0].parameters(), strict=True):
        assert torch.equal(got, want)
    assert scaler.state_dict() == reference[2].state_dict()


def test_a_cursor_is_copied_so_the_loader_cannot_reach_into_the_snapshot():
    """A flat cursor is copied shallowly (enough: its values cannot change in place), any other
    deeply: either way advancing the live one leaves the snapshot's as it was."""
    from accelpact.runtime.snapshot import _copied

    flat = {"seed": 1, "cursor": 3, "name": "shard0"}
    copy_of_flat = _copied(flat)
    flat["cursor"] = 4
    assert copy_of_flat == {"seed": 1, "cursor": 3, "name": "shard0"}
    nested = {"cursor": 3, "order": [2, 0, 1], "inner": {"pos": 5}}
    copy_of_nested = _copied(nested)
    nested["order"].append(7)
    nested["inner"]["pos"] = 6
    assert copy_of_nested == {"cursor": 3, "order": [2, 0, 1], "inner": {"pos": 5}}


def test_schedulers_are_found_outermost_first_in_an_order_no_collection_changes():
    """Found by review: the order came from the heap (gc.get_objects), which a garbage collection
    between their creations changed, and a checkpoint pairs saved states with them in order in
    another process: a restart refused its own checkpoint (or swapped two schedulers' states).
    One inside a SequentialLR is saved and restored by it, so only the outer one is kept."""
    import gc

    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR, StepLR

    from accelpact.runtime.rewind import schedulers_of

    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    warm = LinearLR(opt, total_iters=3)
    gc.collect()  # moves the ones made before it in the heap's order
    cosine = CosineAnnealingLR(opt, T_max=10)
    both = SequentialLR(opt, [warm, cosine], milestones=[3])
    step = StepLR(opt, step_size=5)
    assert schedulers_of(opt) == [both, step]  # by type name; warm and cosine are inside `both`


def test_a_capture_restores_the_module_buffers_it_compares():
    """`state.capture` compares buffers (a Rewind must put them back), so `state.restore` writes them
    back too: else a reference restored from a capture reported its own BatchNorm statistics as a
    mismatch (found by review)."""
    from accelpact import state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4))
    before = state.capture(model, opt)
    model(torch.randn(8, 4))  # moves running_mean, running_var, num_batches_tracked
    assert state.diff(state.capture(model, opt), before)
    state.restore(before, model, opt)
    assert state.diff(state.capture(model, opt), before) == []
