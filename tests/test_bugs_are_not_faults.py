"""A bug in the training step is not a communication fault: every rank rejects together (no peer
hangs), nothing is rewound, and the user sees the original exception."""

from __future__ import annotations

import subprocess
import sys
import traceback

import pytest

from accelpact.testing.spawn import run_world


def _job(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import accelpact

    class Cursor:
        i = 0

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, d):
            self.i = d["i"]

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 4), process_group=dist.new_group(list(range(world_size))))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rt = accelpact.attach(model, opt, data_state=Cursor(), config=accelpact.Config(
        data_timeout_s=1.0, control_timeout_s=10.0, envelope="permissive", on_reject="raise"))

    def load_batch(step):
        if rank == 1 and step == 3:
            raise KeyError("input_ids")  # the user's bug, in the user's code
        return torch.ones(2, 4)

    def update():
        model(load_batch(rt.frontier + 1)).sum().backward()
        opt.step()
        opt.zero_grad()

    out = {}
    try:
        for _ in range(5):
            rt.step(update)
    except Exception as exc:  # noqa: BLE001 - what the user sees is the point of the test
        out = {"type": type(exc).__name__, "text": str(exc), "notes": getattr(exc, "__notes__", []),
               "tb": "".join(traceback.format_exception(exc))}
    out["actions"] = [r.action.value for r in rt.history]
    out["frontier"] = rt.frontier
    return out


@pytest.mark.timeout(90)
def test_a_users_exception_rejects_every_rank_and_reaches_the_user_as_it_is():
    bugged, peer = run_world(_job, 2, timeout_s=60)[::-1]
    assert bugged["type"] == "KeyError" and "input_ids" in bugged["text"]
    assert "load_batch" in bugged["tb"]  # the user's own frame is in the traceback
    assert any("not a communication failure; every rank rejected" in n for n in bugged["notes"])
    assert peer["type"] == "RecoveryRejected" and "rank 1 raised KeyError: 'input_ids' in update 3" in peer["text"]
    for out in (bugged, peer):
        assert out["actions"] == ["reject"] and out["frontier"] == 2  # nothing rewound, nothing preserved


def test_under_exit_the_original_traceback_is_printed_before_exit_75():
    script = (
        "from accelpact.errors import RecoveryRejected\n"
        "from accelpact.runtime.fail_stop import fail_stop\n"
        "def load_batch():\n    raise KeyError('input_ids')\n"
        "try:\n    load_batch()\nexcept KeyError as exc:\n    bug = exc\n"
        "rej = RecoveryRejected(('rank 0 raised KeyError',))\nrej.original = bug\n"
        "fail_stop(rej, on_reject='exit', rank=0)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75
    assert "KeyError: 'input_ids'" in proc.stderr and "load_batch" in proc.stderr
    assert "recovery rejected (exit 75)" in proc.stderr
