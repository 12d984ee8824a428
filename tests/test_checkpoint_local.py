"""Single-process checkpoint tests (no process group: a world of one): round trip, fallbacks, retention."""

from __future__ import annotations

import json
import logging
import random
import shutil
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from accelpact.checkpoint import (
    AppState,
    CheckpointExistsError,
    CheckpointLayoutError,
    CheckpointManager,
    CheckpointSaveError,
    NoVerifiedCheckpointError,
    agreed_failure,
    verify_step_dir,
)
from accelpact.checkpoint.naming import step_dir_name, tmp_dir_name

pytestmark = pytest.mark.timeout(60)

LAYOUT = "single cpu"


class Cursor:
    """A data cursor: position in a deterministic stream (what a sampler/loader would save)."""

    def __init__(self) -> None:
        self.pos = 0
        self.epoch = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(7919 * self.epoch + self.pos)
        self.pos += 1
        return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.pos, self.epoch = sd["pos"], sd["epoch"]


class Trainer:
    """Tiny model + AdamW + scheduler + scaler + cursor; a step draws from torch, NumPy and Python RNGs."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(),
                                         torch.nn.Linear(16, 4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        self.cursor = Cursor()
        self.app = AppState(data_state=self.cursor, scheduler=self.sched, scaler=self.scaler)

    def step(self) -> None:
        x, y = self.cursor.next_batch()
        noise = float(np.random.rand()) * 1e-3 + random.random() * 1e-3
        loss = ((self.model(x) - y) ** 2).mean() + noise
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        self.app.frontier += 1
        self.app.opt_step += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "params": [p.detach().clone() for p in self.model.parameters()],
            "optim": {k: v.clone() for i, s in self.opt.state.items() for k, v in
                      _named_state(self.model, i, s)},
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(legacy=False),
            "python_rng": random.getstate(),
            "cursor": self.cursor.state_dict(),
            "sched": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "frontier": self.app.frontier,
            "opt_step": self.app.opt_step,
        }


def _named_state(model: torch.nn.Module, param: torch.Tensor, state: dict[str, Any]):
    name = next(n for n, p in model.named_parameters() if p is param)
    return [(f"{name}.{k}", v if isinstance(v, torch.Tensor) else torch.tensor(v)) for k, v in state.items()]


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert len(a["params"]) == len(b["params"])
    for x, y in zip(a["params"], b["params"]):
        assert torch.equal(x, y)
    assert a["optim"].keys() == b["optim"].keys() and a["optim"]
    for k in a["optim"]:
        assert torch.equal(a["optim"][k], b["optim"][k]), k
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    na, nb = a["numpy_rng"], b["numpy_rng"]
    assert np.array_equal(na["state"]["key"], nb["state"]["key"]) and na["state"]["pos"] == nb["state"]["pos"]
    assert (na["has_gauss"], na["gauss"]) == (nb["has_gauss"], nb["gauss"])
    for key in ("python_rng", "cursor", "sched", "scaler", "frontier", "opt_step"):
        assert a[key] == b[key], key


def manager(root: Path, **kw: Any) -> CheckpointManager:
    kw.setdefault("layout", LAYOUT)
    return CheckpointManager(root, run_id="run-test", world_size=1, **kw)


def save(mgr: CheckpointManager, t: Trainer):
    return mgr.save(t.app.frontier, model=t.model, optimizer=t.opt, app_state=t.app)


def load(mgr: CheckpointManager, t: Trainer):
    return mgr.load_latest(model=t.model, optimizer=t.opt, app_state=t.app)


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A root with verified steps 2 and 4, and a snapshot of the state each holds."""
    root = tmp_path / "ckpt"
    t, snaps = Trainer(), {}
    mgr = manager(root)
    for _ in range(2):
        for _ in range(2):
            t.step()
        save(mgr, t)
        snaps[t.app.frontier] = t.snapshot()
    return root, snaps


def refusal_logs(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if getattr(r, "event", "") == "checkpoint.refused"]


# -- round trip ------------------------------------------------------------------------------------

def test_round_trip_is_bitwise_and_resumes_identically(tmp_path: Path) -> None:
    t = Trainer(seed=0)
    for _ in range(3):
        t.step()
    mgr = manager(tmp_path)
    report = save(mgr, t)
    assert report.step == 3 and report.bytes > 0 and report.files >= 3 and report.seconds > 0
    saved = t.snapshot()
    t.step()  # the update a restart will have to replay
    after_one_more = t.snapshot()

    fresh = Trainer(seed=123)
    random.seed(5)
    np.random.seed(5)
    loaded = load(mgr, fresh)
    assert loaded is not None and loaded.step == 3 and loaded.refused == () and loaded.latest_note is None
    assert (loaded.frontier, loaded.opt_step) == (3, 3)
    assert_same(saved, fresh.snapshot())
    fresh.step()
    assert_same(after_one_more, fresh.snapshot())  # resume is bitwise identical to never stopping

    manifest = json.loads((Path(report.path) / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and manifest["layout"] == LAYOUT and manifest["run_id"] == "run-test"
    assert manifest["framework"]["version"] == torch.__version__ and manifest["step"] == 3
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in manifest["files"])
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 3


@pytest.mark.parametrize(("kw", "match"), [({"keep": 0}, "keep must be"), ({"keep_every": 0}, "keep_every must be"),
                                           ({"world_size": 0}, "world_size must be"), ({"run_id": ""}, "run_id")])
def test_a_bad_retention_or_shape_is_refused_when_the_manager_is_made(tmp_path: Path, kw, match) -> None:
    """Found by review: keep_every=0 was accepted, and every save's retention then failed (logged
    only), so nothing was ever deleted."""
    args = {"run_id": "run-test", "world_size": 1, "layout": "x", **kw}
    with pytest.raises(ValueError, match=match):
        CheckpointManager(tmp_path, **args)


def test_no_checkpoint_returns_none(tmp_path: Path) -> None:
    assert load(manager(tmp_path / "empty"), Trainer()) is None
    (tmp_path / "only-tmp" / tmp_dir_name(3, "0")).mkdir(parents=True)  # an unpublished save is not one
    assert load(manager(tmp_path / "only-tmp"), Trainer()) is None


# -- corruption falls back to the previous verified step -------------------------------------------

def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "missing_committed": (lambda d: (d / "COMMITTED").unlink(), "COMMITTED marker missing"),
    "missing_shard": (lambda d: (d / "shards" / "__0_0.distcp").unlink(), "missing: shards/__0_0.distcp"),
    "flipped_byte_in_shard": (lambda d: _flip_byte(d / "shards" / "__0_0.distcp"), "sha256 mismatch"),
    "flipped_byte_in_rank_state": (lambda d: _flip_byte(d / "rank-state" / "rank-00000.pt"), "sha256 mismatch"),
    "truncated_manifest": (lambda d: (d / "manifest.json").write_bytes((d / "manifest.json").read_bytes()[:40]),
                           "manifest.json sha256 differs"),
    "truncated_shard": (lambda d: (d / "shards" / ".metadata").write_bytes(b"x"), "size mismatch"),
    "unlisted_file": (lambda d: (d / "shards" / "__7_0.distcp").write_bytes(b"x"), "not listed in the manifest"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_newest_falls_back_with_reason_logged(history, case: str, caplog, monkeypatch) -> None:
    root, snaps = history
    corrupt, reason = CORRUPTIONS[case]
    bad = root / step_dir_name(4)
    corrupt(bad)
    opened: list[str] = []  # nothing from the refused step may ever be unpickled
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: (opened.append(str(f)), real_load(f, *a, **k))[1])
    caplog.set_level(logging.INFO, logger="accelpact.checkpoint")

    t = Trainer(seed=9)
    report = load(manager(root), t)
    assert report is not None and report.step == 2
    assert [r.candidate for r in report.refused] == [bad.name] and reason in report.refused[0].reason
    assert "refused" in (report.latest_note or "")  # latest.json still names the bad step 4
    assert_same(snaps[2], t.snapshot())
    assert refusal_logs(caplog) == [{"root": str(root), "candidate": bad.name, "reason": report.refused[0].reason}]
    assert opened and not any(bad.name in p for p in opened)


def test_latest_json_is_never_trusted(history, caplog) -> None:
    root, snaps = history
    caplog.set_level(logging.INFO, logger="accelpact.checkpoint")
    latest = root / "latest.json"
    for content, note in [(b'{"step": 99}', "does not exist"), (b'{"ste', "unreadable"),
                          (json.dumps({"step": 2}).encode(), "older than the newest verified step 4")]:
        latest.write_bytes(content)
        t = Trainer(seed=1)
        report = load(manager(root), t)
        assert report is not None and report.step == 4 and note in (report.latest_note or "")
        assert_same(snaps[4], t.snapshot())
    assert any(getattr(r, "event", "") == "checkpoint.latest_ignored" for r in caplog.records)
    latest.unlink()
    assert load(manager(root), Trainer()).step == 4  # type: ignore[union-attr]


def test_none_verified_raises_listing_every_refusal(history) -> None:
    root, _ = history
    (root / step_dir_name(4) / "COMMITTED").unlink()
    _flip_byte(root / step_dir_name(2) / "shards" / "__0_0.distcp")
    with pytest.raises(NoVerifiedCheckpointError) as info:
        load(manager(root), Trainer())
    msg = str(info.value)
    assert step_dir_name(4) in msg and "COMMITTED marker missing" in msg
    assert step_dir_name(2) in msg and "sha256 mismatch" in msg
    assert len(info.value.refusals) == 2


def test_latest_without_any_step_is_not_a_fresh_start(history) -> None:
    root, _ = history
    for step in (2, 4):
        shutil.rmtree(root / step_dir_name(step))
    with pytest.raises(NoVerifiedCheckpointError, match="no published step directory exists"):
        load(manager(root), Trainer())


def test_stray_tmp_is_ignored_then_cleaned_at_next_save(history, caplog) -> None:
    root, snaps = history
    caplog.set_level(logging.INFO, logger="accelpact.checkpoint")
    stray = root / tmp_dir_name(6, "3")
    shutil.copytree(root / step_dir_name(4), stray)  # even a complete-looking tmp dir is not published
    t = Trainer(seed=2)
    report = load(manager(root), t)
    assert report is not None and report.step == 4 and report.refused == ()
    assert_same(snaps[4], t.snapshot())
    assert stray.exists()
    for _ in range(2):
        t.step()
    saved = save(manager(root), t)
    assert saved.step == 6 and saved.cleaned_tmp == (stray.name,) and not stray.exists()
    cleaned = [r for r in caplog.records if getattr(r, "event", "") == "checkpoint.tmp_cleaned"]
    assert cleaned and cleaned[0].fields["dirs"] == [stray.name]


# -- shape, immutability, retention ----------------------------------------------------------------

def test_other_layout_is_refused_and_nothing_is_loaded(history) -> None:
    root, snaps = history
    t = Trainer(seed=3)
    t.step()
    before = t.snapshot()
    with pytest.raises(CheckpointLayoutError) as info:
        load(manager(root, layout={"dp": 1, "tp": 1}), t)
    msg = str(info.value)
    assert "world_size=1 layout=\"single cpu\"" in msg and '{"dp":1,"tp":1}' in msg and "nothing was loaded" in msg
    assert info.value.step == 4
    assert_same(before, t.snapshot())


def test_published_step_is_never_overwritten(history) -> None:
    root, _ = history
    manifest = (root / step_dir_name(4) / "manifest.json").read_bytes()
    t = Trainer(seed=4)
    t.app.frontier = 4
    with pytest.raises(CheckpointExistsError, match="already published"):
        save(manager(root), t)
    assert (root / step_dir_name(4) / "manifest.json").read_bytes() == manifest
    assert verify_step_dir(root / step_dir_name(4)).ok
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_retention_keeps_newest_k_verified(tmp_path: Path) -> None:
    t, mgr = Trainer(), manager(tmp_path, keep=2)
    deleted = []
    for _ in range(5):
        t.step()
        deleted.extend(save(mgr, t).deleted)
    assert mgr.verified_steps() == [4, 5]
    assert deleted == [step_dir_name(s) for s in (1, 2, 3)]
    # A corrupt step does not count towards K: the older verified one survives with it.
    _flip_byte(tmp_path / step_dir_name(5) / "shards" / "__0_0.distcp")
    t.step()
    report = save(mgr, t)
    assert report.deleted == ()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-")) == [
        step_dir_name(s) for s in (4, 5, 6)]
    assert mgr.verified_steps() == [4, 6]
    t.step()
    assert save(mgr, t).deleted == (step_dir_name(5), step_dir_name(4))


def test_retention_after_a_restart_reads_no_old_step(tmp_path: Path, monkeypatch) -> None:
    """A new process has hashed nothing yet. Rank 0 re-reading the old steps to judge them held its
    peers in the save's last collective past their bound for any checkpoint past a few GB. They are
    unknown to retention instead: kept until `keep` newer steps are known good, then deleted; a
    milestone is kept."""
    import accelpact.checkpoint.manager as manager_module
    import accelpact.checkpoint.verify as verify_module

    t, first = Trainer(), manager(tmp_path, keep=2, keep_every=2)
    for _ in range(3):
        t.step()
        save(first, t)
    (tmp_path / step_dir_name(0)).mkdir()  # a broken milestone (no marker): known bad without reading a file
    restarted = manager(tmp_path, keep=2, keep_every=2)  # the next attempt: nothing hashed in this process
    monkeypatch.setattr(manager_module, "sha256_file", lambda p: pytest.fail(f"rank 0 re-read {p}"))
    monkeypatch.setattr(verify_module, "sha256_file", lambda p: pytest.fail(f"rank 0 re-read {p}"))
    t.step()
    assert save(restarted, t).deleted == ()  # only step 4 is known good: nothing older may go yet
    t.step()
    assert save(restarted, t).deleted == (step_dir_name(3), step_dir_name(0))  # 1 went before the restart
    monkeypatch.undo()
    assert restarted.verified_steps() == [2, 4, 5]  # the milestone 2 stays, unread


def test_save_errors_are_clear_and_publish_nothing(tmp_path: Path) -> None:
    t = Trainer()
    t.step()
    mgr = manager(tmp_path)
    with pytest.raises(CheckpointSaveError, match=r"app_state.frontier=1 but save\(step=5\)"):
        mgr.save(5, model=t.model, optimizer=t.opt, app_state=t.app)

    class NumpyCursor(Cursor):
        def state_dict(self) -> dict[str, Any]:
            return {"order": np.arange(3)}

    t.app.data_state = NumpyCursor()
    with pytest.raises(CheckpointSaveError, match=r"app_state\['data_state'\]\['order'\] is a numpy.ndarray"):
        save(mgr, t)
    assert mgr.verified_steps() == [] and not (tmp_path / step_dir_name(1)).exists()


def test_verify_step_dir_is_usable_alone(history) -> None:
    root, _ = history
    good = verify_step_dir(root / step_dir_name(4))
    assert good.ok and good.reason == "ok" and good.step == 4 and good.manifest is not None
    assert not verify_step_dir(root / "step-000000000777").ok
    assert "not a published step" in verify_step_dir(root / "latest.json").reason


def test_dcp_failures_become_checkpoint_errors_and_leave_no_temp_directory(tmp_path: Path, monkeypatch) -> None:
    """DCP raises CheckpointException, a BaseException that `except Exception` lets through (a full
    disk then escaped the fail-stop path and left the temp step directory behind)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from accelpact.checkpoint import CheckpointLoadError

    t = Trainer()
    t.step()
    mgr = manager(tmp_path)
    save(mgr, t)  # a good step 1 to load later
    t.step()
    full = CheckpointException("save failed", {0: OSError(28, "No space left on device")})
    monkeypatch.setattr(dcp, "save", lambda *a, **k: (_ for _ in ()).throw(full))
    with pytest.raises(CheckpointSaveError, match=r"rank 0: OSError: \[Errno 28\] No space left on device"):
        save(mgr, t)
    # DCP's own form: (exception, stack summary) per rank; the stack stays out of the reason
    wrapped = CheckpointException("save failed", {0: (OSError(28, "No space left on device"),
                                                      traceback.StackSummary.from_list([]))})
    monkeypatch.setattr(dcp, "save", lambda *a, **k: (_ for _ in ()).throw(wrapped))
    with pytest.raises(CheckpointSaveError, match=r"rank 0: OSError: \[Errno 28\] No space left on device$") as got:
        save(mgr, t)
    assert agreed_failure(got.value)  # DCP raised it on every rank
    assert mgr.verified_steps() == [1]
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
    broken = CheckpointException("load failed", {0: ValueError("bad metadata")})
    monkeypatch.setattr(dcp, "load", lambda *a, **k: (_ for _ in ()).throw(broken))
    with pytest.raises(CheckpointLoadError, match="rank 0: ValueError: bad metadata"):
        load(mgr, t)


def _tamper_consistently(step_dir: Path, payload: bytes) -> None:
    """What whoever can write the directory can do: replace DCP's .metadata (which DCP unpickles)
    and recompute the manifest's digests and COMMITTED, without the signing key."""
    from accelpact.checkpoint.manifest import committed_marker, parse_manifest, sha256_bytes

    (step_dir / "shards" / ".metadata").write_bytes(payload)
    doc = json.loads((step_dir / "manifest.json").read_text())
    for entry in doc["files"]:
        if entry["path"] == "shards/.metadata":
            entry["sha256"], entry["bytes"] = sha256_bytes(payload), len(payload)
    raw = json.dumps(doc, sort_keys=True, indent=2).encode()
    manifest = parse_manifest(raw)
    (step_dir / "manifest.json").write_bytes(raw)
    (step_dir / "COMMITTED").write_text(committed_marker(manifest.step, raw))


def test_with_a_signing_key_a_tampered_step_is_refused_before_anything_is_unpickled(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    import pickle

    import torch.distributed.checkpoint.filesystem as dcp_fs

    t = Trainer()
    t.step()
    signed = manager(tmp_path / "signed", key="correct horse")
    save(signed, t)
    assert "hmac_sha256" in (tmp_path / "signed" / step_dir_name(1) / "COMMITTED").read_text()
    assert signed.verified_steps() == [1]
    assert manager(tmp_path / "signed", key="another key").verified_steps() == []  # mis-signed
    evil = pickle.dumps("would run code when unpickled")
    _tamper_consistently(tmp_path / "signed" / step_dir_name(1), evil)
    unpickled = []
    monkeypatch.setattr(dcp_fs.FileSystemReader, "read_metadata", lambda self: unpickled.append(1))
    with pytest.raises(NoVerifiedCheckpointError, match="COMMITTED is unsigned"):
        load(signed, t)
    assert not unpickled
    # without a key, verification catches corruption, not tampering: the consistent forgery verifies
    unsigned = manager(tmp_path / "plain")
    save(unsigned, t)
    _tamper_consistently(tmp_path / "plain" / step_dir_name(1), evil)
    assert unsigned.verified_steps() == [1]


def test_symbolic_links_inside_a_step_are_refused(history) -> None:
    root, _ = history
    step = root / step_dir_name(4)
    outside = root.parent / "outside.bin"
    outside.write_bytes(b"x")
    (step / "shards" / "extra.distcp").symlink_to(outside)
    verdict = verify_step_dir(step)
    assert not verdict.ok and "symbolic links inside the step are refused: shards/extra.distcp" in verdict.reason


def test_a_manifest_carries_the_runtimes_notes_of_a_changed_experiment(tmp_path: Path) -> None:
    """A job that shrank says so in every later checkpoint (`Runtime.shrinks` -> `extra.shrinks`);
    the note is not part of the layout, so it never makes a restore refuse the step."""
    t = Trainer(seed=0)
    t.step()
    mgr = manager(tmp_path)
    shrinks: list[dict] = []
    mgr.notes["shrinks"] = shrinks  # the runtime's own list: appended to after a shrink
    shrinks.append({"frontier": 1, "replicas_before": 2, "replicas_after": 1})
    report = save(mgr, t)
    manifest = json.loads((Path(report.path) / "manifest.json").read_text())
    assert manifest["extra"]["shrinks"] == [{"frontier": 1, "replicas_before": 2, "replicas_after": 1}]
    assert load(manager(tmp_path), Trainer(seed=1)).step == 1


def test_a_save_that_failed_leaves_no_directory_holding_the_space(tmp_path: Path, monkeypatch) -> None:
    """A full disk: the unpublished step's directory goes at once, not at the next save, which
    needs that space."""
    import errno

    import accelpact.checkpoint.manager as manager_module

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    t, mgr = Trainer(), manager(tmp_path)
    t.step()
    monkeypatch.setattr(manager_module, "write_durable", full)
    with pytest.raises(CheckpointSaveError, match="No space left on device"):
        save(mgr, t)
    assert [p.name for p in tmp_path.iterdir()] == []
