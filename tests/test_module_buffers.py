"""The kept buffer list of the boundary snapshot: the same tensors `model.buffers()` gives, after
every way a model's buffers change, without walking the tree while nothing changed."""

from __future__ import annotations

import torch
from torch import nn

from accelpact.runtime.module_buffers import ModuleBuffers


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ModuleList([nn.Linear(4, 4)]))


def _same(index: ModuleBuffers, model: nn.Module) -> bool:
    got, want = index.current(), tuple(model.buffers())
    return len(got) == len(want) and all(a is b for a, b in zip(got, want))


def test_training_changes_values_not_the_list_so_the_tree_is_walked_once():
    model = _model()
    index = ModuleBuffers(model)
    for _ in range(5):
        model[1](model[0](torch.randn(8, 4))).sum().backward()  # running statistics change in place
        assert _same(index, model)
    assert index.walks == 1


def test_a_registered_or_assigned_buffer_is_found():
    model = _model()
    index = ModuleBuffers(model)
    assert _same(index, model)
    model[0].register_buffer("scale", torch.ones(4))
    assert _same(index, model) and index.walks == 2
    model[0].scale = torch.full((4,), 2.0)  # assignment to a buffer name registers it again
    assert _same(index, model) and index.walks == 3


def test_a_new_submodule_with_buffers_is_found():
    model = _model()
    index = ModuleBuffers(model)
    n = len(index.current())
    model[2].append(nn.BatchNorm1d(4))
    assert _same(index, model) and len(index.current()) == n + 3


def test_buffers_replaced_without_a_hook_or_deleted_are_noticed():
    model = _model()
    index = ModuleBuffers(model)
    before = index.current()
    model.to(torch.float64)  # _apply writes _buffers[name] directly: no registration hook
    assert _same(index, model)
    assert not any(a is b for a, b in zip(before, index.current()) if a.is_floating_point())
    del model[1].running_mean
    assert _same(index, model)


def test_an_unrelated_module_elsewhere_only_costs_a_walk():
    model = _model()
    index = ModuleBuffers(model)
    index.current()
    nn.BatchNorm1d(3)  # any registration in the process bumps the epoch
    assert _same(index, model) and index.walks == 2
