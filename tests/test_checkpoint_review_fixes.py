"""Review findings on the checkpoint layer, one test (or a few) per finding: schedulers and
scalers saved and restored, a refused step saved again, an unreadable step refused like a
corrupt one, a failure after the publishing rename told apart, local causes chained, a
non-UTF-8 attempts line skipped. Single process (no process group) except one 1-rank world."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from accelpact.checkpoint import (
    AppState,
    AttemptLog,
    CheckpointDurabilityError,
    CheckpointLoadError,
    CheckpointManager,
    CheckpointSaveError,
    agreed_failure,
    check_restart_budget,
    verify_step_dir,
)
from accelpact.checkpoint import manager as manager_mod
from accelpact.checkpoint import publish as publish_mod
from accelpact.checkpoint.naming import REFUSED_MARK, classify_entries, step_dir_name
from accelpact.runtime.checkpointing import Checkpointer
from accelpact.testing.spawn import run_world

pytestmark = pytest.mark.timeout(60)


class Cursor:
    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.pos = sd["pos"]


def warmup(epoch: int) -> float:
    return min(1.0, (epoch + 1) / 8)


class Job:
    """A linear model, SGD, a LambdaLR warmup and a GradScaler: one update steps all of them."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
        self.cursor = Cursor()
        self.app = AppState(data_state=self.cursor, stateful=(self.sched, self.scaler))

    def step(self) -> None:
        self.cursor.pos += 1
        loss = self.model(torch.full((2, 4), float(self.cursor.pos))).square().mean()
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        self.app.frontier += 1
        self.app.opt_step += 1

    def steps(self, n: int) -> Job:
        for _ in range(n):
            self.step()
        return self


def manager(root: Path, **kw: Any) -> CheckpointManager:
    kw.setdefault("layout", "single cpu")
    return CheckpointManager(root, run_id="run-review", world_size=1, **kw)


def save(mgr: CheckpointManager, job: Job):
    return mgr.save(job.app.frontier, model=job.model, optimizer=job.opt, app_state=job.app)


def load(mgr: CheckpointManager, job: Job):
    return mgr.load_latest(model=job.model, optimizer=job.opt, app_state=job.app)


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, Job]:
    """A root with verified steps 2 and 4, and the job that saved them (at F=4)."""
    root, job = tmp_path / "ckpt", Job()
    mgr = manager(root)
    for _ in range(2):
        save(mgr, job.steps(2))
    return root, job


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if getattr(r, "event", "") == name]


# -- 1. schedulers and scalers ----------------------------------------------------------------------

def _warmup_world(rank: int, world_size: int, root: str) -> dict[str, Any]:
    """Run A saves at F=4 and goes on to F=6; run B, a restart on the same root, restores F=4 and
    goes on to F=6. The scheduler is the one attach finds (`schedulers_of`)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import accelpact

    def run(updates: int) -> tuple[tuple[int, int, float], list[tuple[int, int, float]]]:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 4), process_group=dist.new_group([0]))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
        rt = accelpact.attach(model, opt, config=accelpact.Config(
            data_timeout_s=2.0, control_timeout_s=10.0, envelope="builtin", on_reject="raise",
            checkpoint_dir=root, checkpoint_every=4))

        def point() -> tuple[int, int, float]:
            return rt.frontier, sched.last_epoch, opt.param_groups[0]["lr"]

        def update() -> None:
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()

        at_attach, seen = point(), []
        while rt.frontier < updates:
            rt.step(update)
            seen.append(point())
        rt.close()
        return at_attach, seen

    out = {"a": run(6), "b": run(6)}
    out["attempts"] = [(r.event, r.frontier if r.checkpoint_step is None else r.checkpoint_step) for r in accelpact.checkpoint.AttemptLog(root, run_id="").records(
        all_runs=True)]
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_restart_restores_the_lr_warmup_as_an_uninterrupted_run_had_it(tmp_path: Path) -> None:
    """The runtime's schedulers (`rt.rewind.stateful`) are in its checkpoints: a restart at F=4
    resumed with last_epoch 0 and the warmup's first LR."""
    (out,) = run_world(_warmup_world, 1, str(tmp_path / "ckpt"), timeout_s=90)
    (_, uninterrupted), (restored_at, resumed) = out["a"], out["b"]
    assert restored_at == uninterrupted[3] == (4, 4, pytest.approx(0.1 * 5 / 8))
    assert resumed == uninterrupted[4:]
    # each start and each `rt.close()` on record: a later launch counts neither as a failure
    assert out["attempts"] == [("started", None), ("fresh_start", None), ("finished", 6),
                               ("started", None), ("restored", 4), ("finished", 6)]


def test_a_checkpoint_of_two_schedulers_is_refused_by_one_by_name(tmp_path: Path) -> None:
    state = Job().steps(2).app.capture()
    fewer = Job()
    fewer.app = AppState(data_state=fewer.cursor, stateful=(fewer.sched,))
    why = fewer.app.problem(state)
    assert why is not None and "2 scheduler(s)/scaler(s) (LambdaLR, GradScaler)" in why
    assert "this run steps 1 (LambdaLR)" in why
    with pytest.raises(CheckpointLoadError, match=r"LambdaLR, GradScaler"):
        fewer.app.restore(state)
    assert fewer.sched.last_epoch == 0  # nothing applied


def test_a_checkpoint_from_before_schedulers_were_saved_loads_and_warns(tmp_path: Path, caplog) -> None:
    state = Job().steps(3).app.capture()
    del state["stateful"]  # what a checkpoint written before this slot holds
    job = Job()
    caplog.set_level(logging.WARNING, logger="accelpact.checkpoint")
    job.app.restore(state)
    assert job.app.frontier == 3 and job.cursor.pos == 3
    assert job.sched.last_epoch == 0  # nothing to restore it from
    warned = events(caplog, "checkpoint.stateful_not_saved")
    assert warned and warned[0]["objects"] == "LambdaLR, GradScaler"


def test_schedulers_and_scalers_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    job = Job().steps(5)
    save(manager(tmp_path), job)
    fresh = Job(seed=1)
    load(manager(tmp_path), fresh)
    assert fresh.sched.state_dict() == job.sched.state_dict()
    assert fresh.scaler.state_dict() == job.scaler.state_dict()
    assert fresh.opt.param_groups[0]["lr"] == job.opt.param_groups[0]["lr"]


# -- 2. a refused step is saved again ---------------------------------------------------------------

def _asides(root: Path) -> list[str]:
    return [name for _, name in classify_entries(os.listdir(root)).refused]


def test_a_step_refused_at_restore_is_set_aside_and_saved_again(history, caplog) -> None:
    root, _ = history
    flip_byte(root / step_dir_name(4) / "shards" / "__0_0.distcp")  # content only: its structure verifies
    mgr, job = manager(root, keep=2), Job(seed=3)
    assert load(mgr, job).step == 2
    caplog.set_level(logging.WARNING, logger="accelpact.checkpoint")
    assert save(mgr, job.steps(2)).step == 4  # was CheckpointExistsError: a restart loop
    (aside,) = _asides(root)
    assert aside.startswith(step_dir_name(4) + REFUSED_MARK)
    assert events(caplog, "checkpoint.refused_set_aside")[0]["moved_to"] == aside
    again = load(manager(root), Job(seed=4))
    assert again.step == 4 and again.refused == ()  # the aside directory is no candidate
    for _ in range(2):  # retention ages it out like a refused step once `keep` newer ones verify
        save(mgr, job.steps(2))
    assert _asides(root) == [] and classify_entries(os.listdir(root)).candidates == (step_dir_name(8), step_dir_name(6))


def test_a_step_whose_structure_fails_is_set_aside_without_a_restore(history) -> None:
    root, _ = history
    (root / step_dir_name(4) / "COMMITTED").unlink()
    job = Job(seed=5).steps(4)
    assert save(manager(root), job).step == 4
    assert len(_asides(root)) == 1 and verify_step_dir(root / step_dir_name(4)).ok


def _owed_saver(root: Path, job: Job, trace: list) -> Checkpointer:
    """A Checkpointer over a real manager and a runtime stub at F=4 (what `after_commit` reads)."""
    import contextlib

    ck = Checkpointer.__new__(Checkpointer)
    ck.every, ck.manager, ck.saves, ck.in_a_row = 0, manager(root), [], 1
    ck.rt = SimpleNamespace(frontier=job.app.frontier, opt_step=job.app.opt_step, data_state=job.cursor,
                            model=job.model, optimizer=job.opt, rewind=SimpleNamespace(stateful=(job.sched,)),
                            trace=SimpleNamespace(write=trace.append),
                            observers=SimpleNamespace(checkpoint=lambda step, error: None),
                            control=SimpleNamespace(timeout_s=5.0, timeout_for=lambda s: contextlib.nullcontext()))
    return ck


@pytest.mark.parametrize("corrupt", [False, True])
def test_an_owed_save_counts_a_published_step_only_if_it_verifies(history, corrupt: bool) -> None:
    """The membership change's owed save found step F published: taken if it verifies, else set
    aside and saved again (it counted a corrupt step as taken)."""
    root, job = history
    if corrupt:
        flip_byte(root / step_dir_name(4) / "shards" / "__0_0.distcp")
    trace: list = []
    ck = _owed_saver(root, job, trace)
    ck.after_commit(ck.rt, owed=True)
    assert ck.in_a_row == 0 and verify_step_dir(root / step_dir_name(4)).ok
    assert trace[-1].get("published_before", False) is not corrupt
    assert len(_asides(root)) == int(corrupt)


# -- 3. an unreadable step is refused, not fatal ----------------------------------------------------

def test_an_unreadable_newest_step_is_refused_and_the_older_one_restored(history, monkeypatch) -> None:
    root, _ = history
    unreadable = {root / step_dir_name(4) / "manifest.json", root / "latest.json"}
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self in unreadable:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    report = load(manager(root), Job(seed=6))
    assert report.step == 2
    (refusal,) = report.refused
    assert refusal.candidate == step_dir_name(4) and refusal.reason.startswith("I/O error reading ")
    assert str(root / step_dir_name(4) / "manifest.json") in refusal.reason
    assert "latest.json unreadable (OSError" in (report.latest_note or "")


# -- 4. a failure after the publishing rename -------------------------------------------------------

@pytest.mark.parametrize("where", ["fsync of the root", "read back"])
def test_a_failure_after_the_rename_reports_the_step_published(history, monkeypatch, where: str) -> None:
    """'nothing was published' was raised with the step on disk, loadable."""
    root, job = history
    final = root / step_dir_name(6)
    eio = OSError(errno.EIO, os.strerror(errno.EIO))
    if where == "fsync of the root":
        real = publish_mod.fsync_dir

        def fsync_dir(path):
            if Path(path) == root and final.exists():
                raise eio
            real(path)

        monkeypatch.setattr(publish_mod, "fsync_dir", fsync_dir)
    else:
        monkeypatch.setattr(manager_mod, "tree_fingerprint", lambda path: (_ for _ in ()).throw(eio))
    with pytest.raises(CheckpointDurabilityError) as info:
        save(manager(root, keep=1), job.steps(2))
    exc = info.value
    assert not isinstance(exc, CheckpointSaveError) and agreed_failure(exc)
    assert f"step 6 is published at {final}" in str(exc) and exc.__cause__ is not None
    monkeypatch.undo()
    assert verify_step_dir(final).ok and load(manager(root), Job(seed=7)).step == 6  # what it says holds
    assert (root / step_dir_name(2)).is_dir()  # retention (keep=1) was skipped
    assert '"step": 4' in (root / "latest.json").read_text()


# -- 5. local causes are chained --------------------------------------------------------------------

class BrokenCursor(Cursor):
    def load_state_dict(self, sd: dict[str, int]) -> None:
        raise KeyError("epoch")


def test_a_failed_restore_names_the_component_and_chains_its_exception(history) -> None:
    root, _ = history
    job = Job(seed=8)
    job.cursor = BrokenCursor()
    job.app.data_state = job.cursor
    with pytest.raises(CheckpointLoadError) as info:
        load(manager(root), job)
    exc = info.value
    assert "restoring the data cursor (BrokenCursor) from the checkpoint failed: KeyError" in str(exc)
    assert isinstance(exc.__cause__, CheckpointLoadError) and isinstance(exc.__cause__.__cause__, KeyError)


def test_a_failed_model_load_chains_its_exception(history, monkeypatch) -> None:
    root, _ = history

    def load_shards(*args: Any) -> None:
        raise KeyError("0.weight")

    monkeypatch.setattr(manager_mod, "load_shards", load_shards)
    with pytest.raises(CheckpointLoadError, match="KeyError") as info:
        load(manager(root), Job(seed=9))
    assert isinstance(info.value.__cause__, KeyError)


def test_failed_saves_chain_their_exception(history, monkeypatch) -> None:
    root, job = history

    def broken_state_dict() -> dict:
        raise KeyError("pos")

    monkeypatch.setattr(job.cursor, "state_dict", broken_state_dict)
    with pytest.raises(CheckpointSaveError, match="writing rank state") as info:
        save(manager(root), job.steps(2))
    assert isinstance(info.value.__cause__, KeyError)
    monkeypatch.undo()

    def no_room(*args: Any) -> Path:
        raise PermissionError(errno.EACCES, "read-only", str(root))

    monkeypatch.setattr(manager_mod, "prepare_tmp", no_room)
    with pytest.raises(CheckpointSaveError, match="could not prepare") as info:
        save(manager(root), job)
    assert isinstance(info.value.__cause__, PermissionError)


# -- 6. attempts.jsonl ------------------------------------------------------------------------------

def test_non_utf8_bytes_in_attempts_are_skipped_like_any_bad_line(tmp_path: Path, caplog) -> None:
    log = AttemptLog(tmp_path, run_id="r", attempt=0)
    log.record_fail_stop(3, "lost a peer")
    with open(log.path, "ab") as stream:
        stream.write(b'{"run_id": "r", \xff\xfe torn}\n')
    log.record_fail_stop(5, "lost another")
    caplog.set_level(logging.WARNING, logger="accelpact.checkpoint")
    assert [r.frontier for r in log.records()] == [3, 5]
    assert check_restart_budget(5, attempt=0, log=log) == 2
    assert events(caplog, "checkpoint.attempt.bad_line")[0]["line"] == 2



def test_a_multistep_schedulers_milestones_are_saved_and_loaded_back():
    """Found by review of the fix above: MultiStepLR keeps its milestones in a Counter, which the
    safety check refused, so every save of such a job failed (and the job stopped itself)."""
    import io
    from collections import Counter

    import torch
    from torch.optim.lr_scheduler import MultiStepLR

    from accelpact.checkpoint.appstate import check_weights_only_safe

    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    state = MultiStepLR(opt, milestones=[2, 4]).state_dict()
    check_weights_only_safe(state, "scheduler")
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["milestones"] == Counter({2: 1, 4: 1})


def test_another_runs_step_an_unreadable_one_and_an_unsigned_one_are_never_set_aside(history, monkeypatch) -> None:
    """Found by review of the set-aside fix: every refusal was recorded, so a later save of that
    step renamed it aside (and retention deleted it as known bad): another run's step in a shared
    directory, a step behind a transient I/O error, a step signed under another key. Only a step
    whose own content or structure is broken is set aside."""
    from accelpact.checkpoint import CheckpointExistsError

    root, job = history
    foreign = CheckpointManager(root, run_id="another-run", world_size=1, layout="single cpu")
    save(foreign, Job(seed=9).steps(6))  # step 6 of another run, in the same directory
    mgr = manager(root)
    report = load(mgr, Job(seed=5))
    assert report.step == 4 and [r.damaged for r in report.refused] == [False]
    with pytest.raises(CheckpointExistsError):  # the other run's step stays where it is
        save(mgr, job.steps(2))
    assert _asides(root) == [] and (root / step_dir_name(6)).is_dir()
    assert mgr.published_problem(6).startswith("written by run 'another-run'")
    with pytest.raises(CheckpointExistsError):  # asking did not mark it for moving either
        save(mgr, job)
    assert _asides(root) == []

    unreadable = root / step_dir_name(4) / "manifest.json"
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == unreadable:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    mgr = manager(root)
    assert load(mgr, Job(seed=7)).step == 2  # 6 is another run's, 4 unreadable
    monkeypatch.setattr(Path, "read_bytes", real)  # the I/O error passes
    with pytest.raises(CheckpointExistsError):
        save(mgr, Job(seed=7).steps(2))  # F=4 again: the step that was unreadable is not moved
    assert _asides(root) == []

    from accelpact.checkpoint import NoVerifiedCheckpointError

    signed = manager(root, key=b"another-key")
    with pytest.raises(NoVerifiedCheckpointError) as err:  # every step is unsigned under this key
        load(signed, Job(seed=8))
    assert not any(r.damaged for r in err.value.refusals)
    with pytest.raises(CheckpointExistsError):
        save(signed, Job(seed=8).steps(4))
    assert _asides(root) == []
