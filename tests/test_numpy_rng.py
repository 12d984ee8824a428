"""numpy's global RNG state read cheaply when the stream has not moved (`checkpoint.numpy_rng`):
the state handed out always equals `np.random.get_state`, whatever was drawn in between."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelpact.checkpoint import numpy_rng
from accelpact.checkpoint.appstate import capture_rng_state_in_memory, restore_rng_state
from accelpact.checkpoint.numpy_rng import NumpyGlobalStream


@pytest.fixture(autouse=True)
def _keep_numpy_global_state():
    saved = np.random.get_state(legacy=False)
    bitgen = np.random.get_bit_generator()
    yield
    np.random.set_bit_generator(bitgen)
    np.random.set_state(saved)


def same_state(a: dict, b: dict) -> bool:
    return (a["bit_generator"] == b["bit_generator"] and np.array_equal(a["state"]["key"], b["state"]["key"])
            and a["state"]["pos"] == b["state"]["pos"] and a["has_gauss"] == b["has_gauss"]
            and a["gauss"] == b["gauss"])


def test_an_untouched_stream_is_read_once_and_a_draw_is_seen():
    stream = NumpyGlobalStream()
    np.random.seed(1)
    first = stream.state()
    assert stream.fast is True, "this numpy's MT19937 struct no longer has the layout checked for"
    assert stream.state() is first and stream.state() is first
    assert (stream.full_reads, stream.reused) == (1, 2)
    np.random.rand()
    moved = stream.state()
    assert moved is not first and stream.full_reads == 2
    assert same_state(moved, np.random.get_state(legacy=False))
    assert not same_state(moved, first)


def test_a_cached_normal_consumed_without_moving_the_key_is_seen_and_restored_bitwise():
    """The legacy normal cache sits outside the struct: a draw that uses it leaves the bytes as
    they were. The kept read held a cached normal, so the next read is a full one."""
    stream = NumpyGlobalStream()
    np.random.seed(7)
    np.random.standard_normal()  # draws two, returns one, caches the other
    before = stream.state()
    assert before["has_gauss"] == 1
    second = np.random.standard_normal()  # the cached one: key and position unchanged
    after = stream.state()
    assert after is not before and after["has_gauss"] == 0
    assert same_state(after, np.random.get_state(legacy=False))
    np.random.set_state(before)
    assert np.random.standard_normal() == second


def test_a_swapped_bit_generator_is_read_in_full():
    stream = NumpyGlobalStream()
    kept = stream.state()
    np.random.set_bit_generator(np.random.MT19937(5))
    swapped = stream.state()
    assert swapped is not kept and same_state(swapped, np.random.get_state(legacy=False))


def test_a_struct_of_another_layout_turns_the_shortcut_off(monkeypatch):
    monkeypatch.setattr(numpy_rng, "layout_matches", lambda raw, state: False)
    stream = NumpyGlobalStream()
    for _ in range(3):
        assert same_state(stream.state(), np.random.get_state(legacy=False))
    assert (stream.fast, stream.full_reads, stream.reused) == (False, 3, 0)


DRAWS = {
    "nothing": lambda: None,
    "rand": lambda: np.random.rand(),
    "normal": lambda: np.random.standard_normal(),
    "624 words": lambda: np.random.randint(0, 2**31, size=624),
    "seed": lambda: np.random.seed(3),
}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(sorted(DRAWS)), min_size=1, max_size=12))
def test_every_read_equals_get_state_whatever_was_drawn(draws):
    stream = NumpyGlobalStream()
    np.random.seed(11)
    for name in draws:
        DRAWS[name]()
        assert same_state(stream.state(), np.random.get_state(legacy=False)), (name, draws)


def test_the_boundary_snapshot_restores_numpy_bitwise_through_the_shortcut():
    np.random.seed(5)
    snap = capture_rng_state_in_memory()
    again = capture_rng_state_in_memory()  # the stream did not move: the same read
    assert again["numpy"] is snap["numpy"]
    drawn = np.random.standard_normal(5)
    restore_rng_state(again)
    assert np.array_equal(np.random.standard_normal(5), drawn)
