"""The edge: the one place where AccelPact ends the process.

The library raises (`RecoveryRejected`, `RestartBudgetExceeded`); `rt.step`, `rt.update` and
`accelpact.attach` hand those to `fail_stop`, which honours `Config.on_reject`
(`ACCELPACT_ON_REJECT`): "raise" re-raises for embedding code to catch, "exit" ends the process
with the documented code for the supervisor (torchrun)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from typing import NoReturn

from ..errors import RankFenced, RecoveryRejected, RestartBudgetExceeded


def _stops_its_agent(rank: int) -> bool:
    """The one worker of each node (its local rank 0) that stops the node's torchrun agent."""
    return os.environ.get("LOCAL_RANK", str(rank)) == "0"


def fail_stop(exc: RecoveryRejected | RestartBudgetExceeded | RankFenced, *, on_reject: str, rank: int) -> NoReturn:
    """A rank whose update raised a bug (`RecoveryRejected.original`) sees that exception itself,
    type, message and traceback, with a note that every rank rejected."""
    original = getattr(exc, "original", None)
    if original is not None:
        original.add_note(f"accelpact: not a communication failure; every rank rejected the recovery ({exc})")
    if on_reject == "raise":
        if original is not None:
            raise original from None
        raise exc
    if original is not None:
        traceback.print_exception(original, file=sys.stderr)
    if isinstance(exc, RankFenced):
        print(f"[accelpact] rank {rank}: {exc}; this process stops (exit {exc.exit_code})", file=sys.stderr, flush=True)
    elif isinstance(exc, RestartBudgetExceeded):
        print(f"[accelpact] rank {rank}: {exc}", file=sys.stderr, flush=True)
        if _stops_its_agent(rank) and os.environ.get("TORCHELASTIC_RUN_ID"):
            # torchrun restarts any failed worker until its own --max-restarts; stopping the agent
            # is the only way a worker can end the job instead of looping. Every node's agent:
            # one stopped on rank 0's node alone left the others' waiting out their rendezvous
            # (found by review); every rank reaches the same verdict.
            try:
                os.kill(os.getppid(), signal.SIGTERM)
            except OSError as err:  # pragma: no cover - the agent is already gone
                print(f"[accelpact] could not stop the torchrun agent: {err}", file=sys.stderr, flush=True)
    else:
        print(f"[accelpact] rank {rank}: recovery rejected (exit {exc.exit_code}): {'; '.join(exc.reasons)}",
              file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exc.exit_code)  # never run atexit handlers that could hang on a broken group
