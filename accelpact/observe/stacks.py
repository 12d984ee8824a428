"""The Python stack of every thread of this process, for the evidence of a suspected hang.

A timeout says only that a peer did not answer in time; where each thread of the stuck rank
was (the trainer inside which collective, a data-loader thread blocked on I/O, a checkpoint
writer) is what tells a hang from a slow peer. `sys._current_frames` is what `faulthandler`
prints, as data."""

from __future__ import annotations

import sys
import threading
import traceback


def thread_stacks(limit: int = 40) -> dict[str, list[str]]:
    """'name (ident)' → the innermost `limit` frames, outermost first, one line per frame."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[str, list[str]] = {}
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)[-limit:]
        out[f"{names.get(ident, 'thread')} ({ident})"] = [
            f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames]
    return out
