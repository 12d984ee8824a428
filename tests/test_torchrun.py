"""The real fail-stop path under torchrun: a fault outside a committed boundary makes every rank
exit with EXIT_REJECTED and leave an evidence record; none resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import accelpact

pytestmark = pytest.mark.multiproc


def torchrun(args: list[str], timeout: float = 100) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           "--max-restarts=0", "-m", "accelpact.demo_worker", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True)


@pytest.mark.timeout(150)
def test_backward_fault_exits_every_rank_with_exit_rejected(tmp_path):
    trace = tmp_path / "trace"
    proc = torchrun(["--updates=5", "--faults=skip@3:backward:0", "--no-reference", "--layers=2",
                     "--data-timeout=1", "--control-timeout=6", f"--trace-dir={trace}"])
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert f"exitcode  : {accelpact.EXIT_REJECTED}" in proc.stderr or f"exitcode: {accelpact.EXIT_REJECTED}" in (
        proc.stderr.replace(" ", "").replace("exitcode:", "exitcode: ")
    ), proc.stderr[-3000:]
    for rank in range(4):
        evidence = json.loads((trace / f"reject-rank{rank}-attempt0.json").read_text())
        assert evidence["exit_code"] == accelpact.EXIT_REJECTED
        assert evidence["frontier"] == 2  # committed updates before the failed one; none after
        assert evidence["reasons"], evidence
        lines = [json.loads(x) for x in (trace / f"trace-rank{rank}.jsonl").read_text().splitlines()]
        actions = [r["action"] for r in lines if r.get("kind") == "edge"]
        assert actions[-1] in ("decide_reject", "abort", "release_reject")
        assert "release" not in actions and "resume_training" not in actions
