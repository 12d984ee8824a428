"""The multi-process harness: results by rank, every rank's traceback, nothing left running."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from accelpact.testing import WorldError, run_world

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]


def _report(rank: int, world_size: int, tag: str) -> dict:
    return {"rank": rank, "group_rank": dist.get_rank(), "size": world_size, "tag": tag,
            "env": os.environ.get("ACCELPACT_TEST_ENV"), "local_rank": os.environ["LOCAL_RANK"]}


def _fail_or_hang(rank: int, world_size: int, pid_dir: str, failing_rank: int | None) -> None:
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == failing_rank:
        raise RuntimeError(f"boom on rank {rank}")
    time.sleep(600)  # stands in for a rank stuck in a collective


def test_results_come_back_in_rank_order_with_the_environment():
    results = run_world(_report, 4, "hello", timeout_s=60, env={"ACCELPACT_TEST_ENV": "set"}, local_world_size=2)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["group_rank"] == r["rank"] and r["size"] == 4 and r["tag"] == "hello" for r in results)
    assert all(r["env"] == "set" for r in results)
    assert [r["local_rank"] for r in results] == ["0", "1", "0", "1"]


def test_a_rank_that_imported_another_accelpact_than_its_caller_is_refused_by_name():
    """A rank of a forkserver started from a checkout imports the checkout's accelpact even when
    the caller's comes from another tree (PYTHONPATH): a comparison of two trees would silently
    run one. Here the caller's package is named as some other directory, as it would be then."""
    from accelpact.config import unknown_variables
    from accelpact.testing.spawn import PACKAGE_ENV, MixedTrees, same_package

    assert unknown_variables({PACKAGE_ENV: "/a/accelpact"}) == []  # every rank has it: no "not a setting" warning
    same_package(None)  # a rank started outside run_world: nothing to compare
    with pytest.raises(MixedTrees, match="imported accelpact from /a, its caller from /b"):
        same_package("/b", mine="/a")
    with pytest.raises(WorldError) as error:
        run_world(_report, 2, "x", timeout_s=60, env={PACKAGE_ENV: "/elsewhere/accelpact"}, grace_s=1.0)
    for outcome in error.value.outcomes.values():
        assert not outcome.ok
        assert "its caller from /elsewhere/accelpact" in outcome.detail, outcome.detail
        assert "start the caller from a directory without an accelpact/ package" in outcome.detail


def _assert_all_dead(pid_dir: Path) -> None:
    pids = [int(path.read_text()) for path in pid_dir.iterdir()]
    assert len(pids) == 4
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_failing_rank_reports_its_traceback_and_the_others_are_killed(tmp_path):
    start = time.monotonic()
    with pytest.raises(WorldError) as error:
        run_world(_fail_or_hang, 4, str(tmp_path), 1, timeout_s=60, grace_s=1.0)
    assert time.monotonic() - start < 30
    assert error.value.reason == "rank 1 raised"
    assert "RuntimeError: boom on rank 1" in error.value.outcomes[1].detail
    assert "no result (killed)" in str(error.value)
    _assert_all_dead(tmp_path)


def test_a_hung_world_is_killed_at_its_timeout(tmp_path):
    # 5 s: forked from the preloaded forkserver, the four ranks are up and hung (pid files written)
    # within a second even on loaded cores; the rest of a longer timeout is only waited out
    start = time.monotonic()
    with pytest.raises(WorldError, match="timed out after 5.0 s") as error:
        run_world(_fail_or_hang, 4, str(tmp_path), None, timeout_s=5.0)
    assert time.monotonic() - start < 45  # 5 s, then gdb's native stacks (bounded at 30 s), then the kill
    _assert_all_dead(tmp_path)
    # each hung rank's threads at the kill name the call it hung in (faulthandler, SIGUSR1)
    for rank in range(4):
        detail = error.value.outcomes[rank].detail
        assert detail.startswith("no result (killed); its threads at the kill:"), detail
        assert "in _fail_or_hang" in detail, detail
        if shutil.which("gdb"):  # and its native threads, where gdb can attach (a hang in C++ names its frame)
            assert "--- native stacks (gdb):" in detail and "\n#0 " in detail, detail[-3000:]
    assert not list(Path(tempfile.gettempdir()).glob(f"accelpact-world-{os.getpid()}-*.stacks"))


def test_a_rank_starts_its_function_only_once_every_peer_has_connected():
    """`wait_for_world`: the first ranks wait for the last one; a missing rank is named after the
    timeout instead of letting the others run (and exit) while it still connects."""
    import datetime
    import threading

    from accelpact.testing.spawn import wait_for_world

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    peer = dist.TCPStore("127.0.0.1", store.port, None, False, timeout=datetime.timedelta(seconds=10))
    returned: list[float] = []
    early = threading.Thread(target=lambda: (wait_for_world(peer, 2, 10.0), returned.append(time.monotonic())))
    early.start()
    time.sleep(0.3)
    assert not returned, "a rank went on before its peer had connected"
    last_arrived = time.monotonic()
    wait_for_world(store, 2, 10.0)
    early.join(timeout=10)
    assert returned and returned[0] >= last_arrived

    alone = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    with pytest.raises(TimeoutError, match="only 1 of 3 ranks connected their default group within 0.2 s"):
        wait_for_world(alone, 3, 0.2)
