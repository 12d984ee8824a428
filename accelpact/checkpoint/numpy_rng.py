"""numpy's global RNG state, read without its cost when the stream has not moved.

Every boundary snapshot takes numpy's global state, and `RandomState.get_state` copies the 624
words of its MT19937 key one element at a time: 44 µs warm, 60-86 µs of the training thread on
every update here, although most training loops never draw from numpy's global stream. The raw
state struct is 2,500 bytes behind numpy's documented ctypes interface
(`BitGenerator.ctypes.state_address`) and reads in ~1 µs, so a snapshot first compares those
bytes with the ones behind its last full read, and hands that read out again when they match.

Equal bytes prove an equal state except for the legacy normal cache (``has_gauss``/``gauss``,
held beside the struct, not in it): a draw may consume a cached normal without moving the key
or position. So the last read is reused only when it held no cached normal; and since a draw
with an empty cache always moves the position, equal bytes after such a read mean no draw at
all. The struct's layout (``uint32 key[624]; int pos``) is numpy's own and not a promise: the
first read checks it against `get_state`, and if they differ every read is a full one.
Not covered: `np.random.set_state` called by the user with the very key and position already
there but another cached normal (the bytes cannot show it).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

MT19937_WORDS = 624
STATE_BYTES = MT19937_WORDS * 4 + 4  # mt19937_state: uint32_t key[624]; int pos


class NumpyGlobalStream:
    """`state()`: numpy's global RandomState state in its own dict form (legacy=False)."""

    def __init__(self) -> None:
        self.fast: bool | None = None  # None: the struct's layout not checked yet
        self._source: Any = None  # the bit generator the kept read is of
        self._raw: bytes | None = None
        self._state: dict[str, Any] | None = None
        self.full_reads = 0
        self.reused = 0

    def state(self) -> dict[str, Any]:
        """The current state. The dict may be one handed out before: callers must not change it
        (`np.random.set_state` copies it)."""
        if self.fast is False:
            self.full_reads += 1
            return np.random.get_state(legacy=False)
        source = np.random.get_bit_generator()  # np.random.set_bit_generator may swap it
        raw = ctypes.string_at(source.ctypes.state_address, STATE_BYTES)
        kept = self._state
        if kept is not None and raw == self._raw and source is self._source and not kept["has_gauss"]:
            self.reused += 1
            return kept
        state = np.random.get_state(legacy=False)
        self.full_reads += 1
        if self.fast is None:
            self.fast = layout_matches(raw, state)
            if not self.fast:
                return state
        self._source, self._raw, self._state = source, raw, state
        return state


def layout_matches(raw: bytes, state: dict[str, Any]) -> bool:
    """Whether `raw` (the struct behind the ctypes address) holds `state`'s key and position."""
    inner = state.get("state", {})
    if state.get("bit_generator") != "MT19937" or len(raw) != STATE_BYTES:
        return False
    key = np.frombuffer(raw, dtype=np.uint32, count=MT19937_WORDS)
    pos = int(np.frombuffer(raw, dtype=np.int32, count=1, offset=MT19937_WORDS * 4)[0])
    return bool(np.array_equal(key, np.asarray(inner.get("key")))) and pos == int(inner.get("pos", -1))


#: numpy's global stream is one per process, and so is what is kept of it.
GLOBAL_STREAM = NumpyGlobalStream()
