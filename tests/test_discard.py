"""discard_partial_update: after an exception inside forward or backward, a re-run of the same update
must give bitwise what the uninterrupted update gives (the heart of Rewind).

Each multi-process world (4 ranks, HSDP 2 × 2, two blocks) trains an uninterrupted reference, then
trains again with update 2 interrupted *on every rank at the same point*: a tensor hook on the
first block's output raises in backward (after the second block's gradients were reduced, while
the first block is gathered and the root's gradients are unreduced), a forward pre-hook of the
second block raises in forward (after the root's and the first block's all-gathers), or, for
FSDP, a collective raises as a timed-out one would (see ``VARIANTS``). The rank catches it, calls
discard, restores RNG and data cursor and re-runs update 2 and the rest; the result must equal the
reference bit for bit. A control run with ``zero_grad`` instead of discard must fail or diverge.
The groups stay healthy because every rank fails alike; replacing broken groups is not discard's job.
"""

from __future__ import annotations

import copy
import inspect
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from accelpact.checkpoint.appstate import capture_rng_state, restore_rng_state
from accelpact.runtime.ddp_buckets import isolate_buckets
from accelpact.runtime.discard import (
    FSDP1_RESET,
    FSDP2_RESET,
    DiscardResult,
    discard_partial_update,
    partial_state,
)
from accelpact.state import capture, diff
from accelpact.testing.spawn import run_world
from accelpact.workloads import (
    HSDPLayout,
    SyntheticTokens,
    TinyDecoder,
    build_hsdp_job,
    make_adam,
    seed_everything,
    stochastic_update,
)

SEED = 11
LAYERS = 2
UPDATES = 4  # update 2 (index 1) is the interrupted one
WORLD = 4
#: where update 2 fails: a hook raising in backward / forward, or the Python-level collective FSDP
#: calls raising (as a timed-out collective does) at its n-th call in the update: the 2nd all-gather
#: (the first block's, after the root's) or the 2nd HSDP all-reduce (the first block's, after the
#: second block was reduce-scattered and all-reduced and the first block was reduce-scattered).
#: DDP's reducer calls its collectives from C++, so only the hook faults apply to it.
VARIANTS = ("backward", "forward", "allgather", "allreduce")
COLLECTIVE_FAULTS = {"allgather": (("all_gather_single", "all_gather"), 2), "allreduce": (("all_reduce",), 2)}
#: frameworks as build_hsdp_job names them, plus DDP with buckets small enough that some bucket
#: all-reduces are launched before the fault and others are not
WORLDS = {"fsdp2": ("fsdp2",), "fsdp1": ("fsdp1",), "fsdp1-orig": ("fsdp1-orig",),
          "ddp": ("ddp", "ddp-small-buckets")}


class InjectedFault(RuntimeError):
    """Stands in for a collective that timed out or a hook that raised."""


# --------------------------------------------------------------------------------------------
# what runs on every rank


def _build(framework: str, generation: int) -> tuple[nn.Module, torch.optim.Optimizer, SyntheticTokens]:
    if framework != "ddp-small-buckets":
        return build_hsdp_job(framework, layers=LAYERS, seed=SEED, seq_len=8, batch_size=2, generation=generation)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    layout = HSDPLayout(nodes=dist.get_world_size() // 2, local=2)
    groups = layout.build_groups(generation=generation)
    model = TinyDecoder(n_layers=LAYERS, seed=SEED)
    wrapped = DistributedDataParallel(model, process_group=groups.replicate, bucket_cap_mb=0.01)
    data = SyntheticTokens(model.vocab, 8, 2, seed=SEED, shard=dist.get_rank())
    return wrapped, make_adam(wrapped), data


def _layers(model: nn.Module) -> nn.ModuleList:
    return next(m for name, m in model.named_modules() if name.endswith("layers") and isinstance(m, nn.ModuleList))


def _variants(framework: str) -> tuple[str, ...]:
    return VARIANTS if framework.startswith("fsdp") else VARIANTS[:2]


def _arm(model: nn.Module, variant: str) -> Callable[[], None]:
    """A one-shot fault at the same point on every rank; returns what disarms it."""
    fired: list[bool] = []

    def fire(*_: Any) -> None:
        if not fired:
            fired.append(True)
            raise InjectedFault(f"injected {variant} fault")

    if variant in COLLECTIVE_FAULTS:
        import torch.distributed as dist

        names, nth = COLLECTIVE_FAULTS[variant]  # FSDP1 all-gathers CPU tensors with dist.all_gather
        originals = {name: getattr(dist, name) for name in names}
        calls: list[str] = []

        def failing(name: str) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                if len(calls) == nth:
                    fire()
                return originals[name](*args, **kwargs)

            return call

        def disarm() -> None:
            for name, original in originals.items():
                setattr(dist, name, original)

        for name in names:  # FSDP looks the collective up on the module at every call
            setattr(dist, name, failing(name))
        return disarm

    layers = _layers(model)
    if variant == "forward":  # after FSDP's own pre-forward hook of that block (registered earlier)
        return layers[1].register_forward_pre_hook(fire).remove

    def hook_output(_module: nn.Module, _args: Any, output: torch.Tensor) -> None:
        # registered after FSDP's pre-backward hook on the same tensor, so that one has run
        output.register_hook(fire)

    return layers[0].register_forward_hook(hook_output).remove


def _noop_check(model: nn.Module, optimizer: torch.optim.Optimizer, data: SyntheticTokens) -> dict[str, Any]:
    before = capture(model, optimizer, data)
    report = discard_partial_update(model, optimizer)
    return {"report": report.to_dict(), "was_idle": report.was_idle,
            "diff": diff(before, capture(model, optimizer, data)), "partial": partial_state(model, optimizer)}


def _interrupted_run(framework: str, variant: str, generation: int, reference: dict[str, Any],
                     naive: bool = False) -> dict[str, Any]:
    seed_everything(SEED)
    model, optimizer, data = _build(framework, generation)
    if framework.startswith("ddp"):
        # as the runtime does where Rewind after backward is qualified: without it, a bucket
        # all-reduce of the interrupted backward that completes late lands in the re-run's bucket
        # (test_ddp_buckets forces that race; here the reference keeps the built-in all-reduce)
        isolate_buckets(model)
    out: dict[str, Any] = {"noop_before": _noop_check(model, optimizer, data)}  # before lazy init
    stochastic_update(model, optimizer, data)
    out["noop"] = _noop_check(model, optimizer, data)  # at a committed boundary

    rng, cursor = capture_rng_state(), copy.deepcopy(data.state_dict())
    disarm = _arm(model, variant)
    try:
        stochastic_update(model, optimizer, data)
        raise AssertionError(f"the {variant} fault did not fire")
    except InjectedFault:
        pass
    finally:
        disarm()
    out["before"] = partial_state(model, optimizer)
    if framework.startswith("ddp"):  # rebuilt in update 2's forward from update 1's gradient order
        out["buckets"] = len(model.reducer._get_zeros_like_grad_buckets())
    if naive:  # the control: what a trainer without discard would do
        optimizer.zero_grad(set_to_none=True)
    else:
        start = time.perf_counter()
        report: DiscardResult = discard_partial_update(model, optimizer)
        out["discard_s"] = time.perf_counter() - start
        out["report"] = report.to_dict()
        out["after"] = partial_state(model, optimizer)
        out["again"] = discard_partial_update(model, optimizer).was_idle  # idempotent

    restore_rng_state(rng)
    data.load_state_dict(cursor)
    try:
        for _ in range(1, UPDATES):
            stochastic_update(model, optimizer, data)
    except Exception as exc:
        if not naive:
            raise
        out["raised"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out
    out["after_training"] = partial_state(model, optimizer)
    state = capture(model, optimizer, data)
    out["mismatches"] = diff(state, reference)
    out["compared"] = len(state)
    return out


def _world(rank: int, world_size: int, frameworks: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    generation = 0
    for framework in frameworks:
        seed_everything(SEED)
        model, optimizer, data = _build(framework, generation)
        for _ in range(UPDATES):
            stochastic_update(model, optimizer, data)
        reference = capture(model, optimizer, data)
        del model, optimizer
        for variant in _variants(framework):
            generation += 100
            results[f"{framework}/{variant}"] = _interrupted_run(framework, variant, generation, reference)
        generation += 100
        results[f"{framework}/naive"] = _interrupted_run(framework, "backward", generation, reference, naive=True)
        generation += 100
    return results


_WORLD_RESULTS: dict[str, list[dict[str, Any]]] = {}


def _results(world: str) -> list[dict[str, Any]]:
    if world not in _WORLD_RESULTS:
        _WORLD_RESULTS[world] = run_world(_world, WORLD, WORLDS[world], timeout_s=150, local_world_size=2)
    return _WORLD_RESULTS[world]


# --------------------------------------------------------------------------------------------
# multi-process: bitwise continuation after discard

CASES = [(world, framework, variant) for world, frameworks in WORLDS.items()
         for framework in frameworks for variant in _variants(framework)]


@pytest.mark.multiproc
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("world", "framework", "variant"), CASES, ids=[f"{f}-{v}" for _, f, v in CASES])
def test_rerun_after_discard_is_bitwise_equal(world: str, framework: str, variant: str) -> None:
    for rank, by_case in enumerate(_results(world)):
        got = by_case[f"{framework}/{variant}"]
        report = got["report"]
        if framework.startswith("ddp") and variant == "forward":
            assert got["before"] == [], (rank, got["before"])  # DDP keeps nothing from a failed forward
        else:
            assert got["before"], f"rank {rank}: nothing partial after the fault: the test would prove nothing"
            assert report["units_reset"] > 0, (rank, report)
        if variant in ("backward", "allreduce"):
            assert report["grads_dropped"] > 0, (rank, report)
        if framework.startswith("fsdp"):
            assert report["params_freed"] > 0, (rank, report)  # the root (and a block) were gathered
        if framework == "ddp-small-buckets":  # so some bucket all-reduces ran before the fault, some not
            assert got["buckets"] > 2, (rank, got["buckets"])
        assert got["after"] == [], f"rank {rank}: {got['after']}"
        assert got["again"], f"rank {rank}: a second discard still found something to reset"
        assert got["after_training"] == [], f"rank {rank}: {got['after_training']}"
        assert got["compared"] > 0
        assert got["mismatches"] == [], f"rank {rank}: {got['mismatches'][:8]}"


@pytest.mark.multiproc
@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", list(WORLDS))
def test_discard_at_a_committed_boundary_is_a_no_op(world: str) -> None:
    for rank, by_case in enumerate(_results(world)):
        for case, got in by_case.items():
            for key in ("noop_before", "noop"):
                check = got[key]
                assert check["was_idle"], (rank, case, key, check["report"])
                assert check["diff"] == [], (rank, case, key, check["diff"])
                assert check["partial"] == [], (rank, case, key, check["partial"])


@pytest.mark.multiproc
@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", list(WORLDS))
def test_without_discard_the_rerun_fails_or_diverges(world: str) -> None:
    """The control: after the same backward fault, zero_grad alone does not give the uninterrupted run."""
    for rank, by_case in enumerate(_results(world)):
        for framework in WORLDS[world]:
            got = by_case[f"{framework}/naive"]
            assert got.get("raised") or got["mismatches"], (rank, framework, got["before"][:4])


# --------------------------------------------------------------------------------------------
# single process


def test_unknown_model_type_raises_a_type_error_naming_it() -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"torch\.nn\.modules\.linear\.Linear"):
        discard_partial_update(model, optimizer)
    with pytest.raises(TypeError, match="Linear"):
        partial_state(model)
    with pytest.raises(TypeError, match="dict"):
        discard_partial_update({}, optimizer)  # type: ignore[arg-type]


def _assigned(source: str, owners: str) -> set[str]:
    """Attributes that ``source`` assigns or clears on objects named by the ``owners`` regex."""
    pattern = rf"\b(?:{owners})(?:\.\w+)*\.(\w+)\s*(?:=(?!=)|\.clear\(\))"
    return set(re.findall(pattern, source))


def test_fsdp2_reset_covers_what_torch_resets_after_an_aborted_iteration() -> None:
    """torch's own FSDPModule.reset_iter_state lists FSDP2's per-iteration state; discard must reset
    all of it (it does not call it: it waits on pending Work, which can block on a broken group)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    torch_resets = _assigned(inspect.getsource(FSDPState._reset_iter_state), "self|state")
    torch_resets |= _assigned(inspect.getsource(FSDPParamGroup._reset_iter_state), "self")
    torch_resets |= _assigned(inspect.getsource(FSDPState._root_post_backward_final_callback), "self|state")
    torch_resets -= {"is_last_backward"}  # a user setting, not per-iteration state
    assert torch_resets, "the source pin found nothing: the regex or torch changed"
    assert torch_resets <= FSDP2_RESET, f"torch resets attributes discard does not: {torch_resets - FSDP2_RESET}"


def test_fsdp1_reset_covers_what_the_post_backward_final_callback_resets() -> None:
    from torch.distributed.fsdp import _runtime_utils

    source = inspect.getsource(_runtime_utils._post_backward_final_callback)
    source += inspect.getsource(_runtime_utils._finalize_params)
    torch_resets = _assigned(source, "handle|fsdp_state|root_state|state|flat_param")
    torch_resets |= set(re.findall(r'delattr\(\w+, "(\w+)"\)', source))
    assert torch_resets, "the source pin found nothing: the regex or torch changed"
    assert torch_resets <= FSDP1_RESET, f"torch resets attributes discard does not: {torch_resets - FSDP1_RESET}"
