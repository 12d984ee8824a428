"""CheckpointManager: the L2 (Restart) path's verified checkpoint, saved and restored collectively.

Save publishes ``<root>/step-<F>`` through the protocol in :mod:`.publish`; load walks published
steps newest first on rank 0, verifies every byte before anything is unpickled, and broadcasts
the choice so that all ranks restore the same step or all fail with the same error.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .appstate import AppState
from .attempts import restart_count
from .collective import Comm, raise_from_local
from .errors import (
    CheckpointDurabilityError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointLayoutError,
    CheckpointLoadError,
    CheckpointSaveError,
    NoVerifiedCheckpointError,
    Refusal,
    agreed_failure,
)
from .events import log_event
from .fsio import sha256_file, tree_fingerprint, write_durable
from .manifest import Layout, Manifest, describe_layout, normalize_layout
from .naming import LATEST_NAME, SHARDS_DIR, classify_entries, rank_state_name, step_dir_name
from .publish import (
    assemble_entries,
    commit_and_publish,
    delete_steps,
    hash_stripe,
    latest_pointer,
    loadability_problem,
    prepare_tmp,
    published_not_durable,
    raise_gathered,
    set_aside,
    stray_tmp_dirs,
    utc_now,
    write_latest,
)
from .retention import retention_plan
from .selection import Outcome, Selection, judge_latest, parse_latest, select_candidate
from .shards import load_shards, save_shards
from .verify import Verdict, verify_step_dir

INFO, WARNING = logging.INFO, logging.WARNING


@dataclass(frozen=True)
class SaveResult:
    """What one save published and what it cost (seconds are wall time on this rank)."""

    step: int
    path: str
    bytes: int
    files: int
    seconds: float
    write_seconds: float
    hash_seconds: float
    publish_seconds: float
    deleted: tuple[str, ...] = ()
    cleaned_tmp: tuple[str, ...] = ()


@dataclass(frozen=True)
class RestoreResult:
    """Which checkpoint was restored, what was refused on the way, and what it cost."""

    step: int
    path: str
    frontier: int
    opt_step: int
    saved_attempt: str
    refused: tuple[Refusal, ...]
    latest_note: str | None
    bytes: int
    seconds: float
    verify_seconds: float


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _agreed(comm: Comm, outcome: tuple | None, failure: str, local: BaseException | None = None) -> tuple:
    """Broadcast rank 0's ("ok" | "exists" | "published_not_durable" | "error", detail, extra) and
    raise the same error on every rank, so no rank carries on with a save that another abandoned;
    `local`: this rank's own exception behind it, chained."""
    outcome = comm.broadcast(outcome)
    assert outcome is not None
    if outcome[0] == "exists":
        raise_from_local(CheckpointExistsError(outcome[1], agreed=True), local)
    if outcome[0] == "published_not_durable":
        raise_from_local(CheckpointDurabilityError(outcome[1], agreed=True), local)
    if outcome[0] != "ok":
        raise_from_local(CheckpointSaveError(f"{failure}: {outcome[1]}", agreed=True), local)
    return outcome


class CheckpointManager:
    """Verified, sharded checkpoints of one run under ``root`` (one writer run per root).

    ``layout`` describes the parallel shape (e.g. "hsdp 2x2 fsdp2" or a dict); together with
    ``world_size`` it must match for a checkpoint to be loaded. ``keep`` newest verified steps
    survive retention, plus milestones (step % keep_every == 0) when ``keep_every`` is set.
    ``group`` is the process group for the checkpoint's collectives (default WORLD; a Gloo group
    such as the control plane's is best). ``attempt`` defaults to TORCHELASTIC_RESTART_COUNT.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        run_id: str,
        world_size: int,
        layout: Layout,
        keep: int = 3,
        keep_every: int | None = None,
        group: dist.ProcessGroup | None = None,
        attempt: int | str | None = None,
        key: str | bytes | None = None,
    ) -> None:
        """`key`: the checkpoint signing key (ACCELPACT_CHECKPOINT_KEY). With it every COMMITTED
        is signed, and a step that is unsigned or mis-signed is refused before any of its files
        is unpickled."""
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if keep_every is not None and keep_every < 1:  # else every save's retention fails, and nothing is deleted
            raise ValueError(f"keep_every must be >= 1 or None, got {keep_every}")
        self.root = Path(root)
        self.run_id = run_id
        self.world_size = world_size
        self.layout = normalize_layout(layout)
        #: JSON-able facts the manifest carries beside the layout (not compared at restore): the
        #: runtime's record of how the experiment changed (`Runtime.shrinks`)
        self.notes: dict[str, Any] = {}
        self.keep = keep
        self.keep_every = keep_every
        self.group = group
        self.attempt = str(restart_count() if attempt is None else attempt)
        self._hashed: dict[str, tuple] = {}  # step dir name -> file fingerprint when it last verified
        #: step dir name -> why this process refused it (a restore, `published_problem`): a save of
        #: that step sets it aside (`_set_aside_refused`) instead of refusing to overwrite it
        self._refused: dict[str, str] = {}
        if key is not None and not key:  # a secret that expanded to nothing: never sign with it silently
            raise ValueError("the checkpoint key is empty (pass None for unsigned checkpoints)")
        self._key = (hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()
                     if key is not None else None)

    # -- helpers -------------------------------------------------------------------------------

    def _comm(self) -> Comm:
        comm = Comm(self.group)
        if comm.world_size != self.world_size:
            hint = "" if comm.enabled else " (torch.distributed is not initialised)"
            raise CheckpointError(
                f"CheckpointManager was built for world_size={self.world_size} but the process group has "
                f"{comm.world_size} rank(s){hint}"
            )
        return comm

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def _verify(self, name: str, *, hash_files: bool = True) -> Verdict:
        """Full verification, remembering the files' fingerprint when it passes (retention counts
        such a step as known good while its files keep their size, mtime and inode:
        `_retention_verdict`). ``hash_files=False``: every check but the content's digests (a load
        hashes the chosen step on every rank, `_stripes_agreed`)."""
        path = self.root / name
        if not hash_files:
            return verify_step_dir(path, hash_files=False, key=self._key)
        try:
            fingerprint = tree_fingerprint(path) if path.is_dir() else None
        except OSError:
            fingerprint = None
        verdict = verify_step_dir(path, key=self._key)
        if verdict.ok and fingerprint is not None and tree_fingerprint(path) == fingerprint:
            self._hashed[name] = fingerprint
        else:
            self._hashed.pop(name, None)
        return verdict

    # -- save ----------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        app_state: AppState,
    ) -> SaveResult:
        """Collectively save and publish ``step-<step>``; every rank must call it with the same step.

        Raises CheckpointExistsError (all ranks) if the step is already published and was not
        refused, CheckpointSaveError (all ranks) if any rank fails, nothing being published then,
        and CheckpointDurabilityError (all ranks) if what follows the publishing rename fails.
        """
        t0 = time.perf_counter()
        comm = self._comm()
        step_dir_name(step)  # validates step
        local = None
        if app_state.frontier != step:
            local = (f"app_state.frontier={app_state.frontier} but save(step={step}): a checkpoint is named "
                     "by the committed frontier it holds")
        seen = comm.all_gather((step, local))
        raise_gathered([e for _, e in seen], f"save of step {step}")
        if len({s for s, _ in seen}) != 1:
            raise CheckpointSaveError(f"ranks disagree on the step to save: {[s for s, _ in seen]}", agreed=True)

        prep: tuple[str, Any, Any] | None = None
        prep_exc: Exception | None = None
        if comm.is_coordinator:
            try:
                stray = stray_tmp_dirs(self.root)
                cleaned = tuple(p.name for p in stray)
                if stray:
                    failures = delete_steps(self.root, cleaned)
                    log_event(WARNING, "checkpoint.tmp_cleaned", "removed unpublished save directories",
                              root=str(self.root), dirs=list(cleaned), failures=failures)
                self._set_aside_refused(step)
                prep = ("ok", str(prepare_tmp(self.root, step, self.attempt)), cleaned)
            except CheckpointExistsError as exc:
                prep, prep_exc = ("exists", str(exc), ()), exc
            except Exception as exc:  # noqa: BLE001 - reported to every rank below, chained on this one
                prep, prep_exc = ("error", _err(exc), ()), exc
        prep = _agreed(comm, prep, f"rank 0 could not prepare step {step} under {self.root}", prep_exc)
        tmp, cleaned = Path(prep[1]), prep[2]

        # Every rank: shards (DCP raises on every rank if any rank fails) and its own state file.
        try:
            referenced = save_shards(tmp / SHARDS_DIR, model, optimizer, comm)
        except Exception as exc:  # DCP gathers its failures and raises on every rank
            self._drop_unpublished(comm, tmp)  # an unpublished step directory is never left behind
            raise CheckpointSaveError(f"DCP save of step {step} into {tmp} failed: {_err(exc)}",
                                      agreed=agreed_failure(exc)) from exc
        local: Exception | None = None
        try:
            payload = {"rank": comm.rank, "world_size": comm.world_size, "step": step, "run_id": self.run_id,
                       "attempt": self.attempt, "app": app_state.capture()}
            buf = io.BytesIO()
            torch.save(payload, buf)
            write_durable(tmp / rank_state_name(comm.rank), buf.getvalue())
        except Exception as exc:  # noqa: BLE001 - gathered, raised on every rank (chained on this one)
            local = exc
        try:
            comm.agree(local, f"writing rank state for step {step}", CheckpointSaveError)
        except CheckpointSaveError:
            self._drop_unpublished(comm, tmp)
            raise
        t_written = time.perf_counter()

        local_entries, local = [], None
        try:
            local_entries = hash_stripe(tmp, comm.rank, comm.world_size)
        except Exception as exc:  # noqa: BLE001 - gathered, raised on every rank (chained on this one)
            local = exc
        gathered = comm.all_gather((local_entries, None if local is None else _err(local)))
        t_hashed = time.perf_counter()

        result: tuple[str, Any, Any] | None = None
        if comm.is_coordinator:
            try:
                raise_gathered([e for _, e in gathered], f"hashing step {step}")
                entries = assemble_entries(tmp, [ents for ents, _ in gathered])
                why = loadability_problem(entries, referenced, comm.world_size)
                if why:
                    raise CheckpointSaveError(why)
                manifest = Manifest(
                    run_id=self.run_id, attempt=self.attempt, step=step, world_size=self.world_size,
                    layout=self.layout, torch_version=torch.__version__, files=tuple(entries),
                    created_at=utc_now(), frontier=app_state.frontier, opt_step=int(app_state.opt_step),
                    extra={"python": platform.python_version(), "numpy": np.__version__,
                           "host": platform.node(), "world_description": describe_layout(self.world_size,
                                                                                         self.layout),
                           **json.loads(json.dumps(self.notes, default=str))},
                )
                name = step_dir_name(step)
                commit_and_publish(tmp, self.root / name, manifest, self._key)
                self._hashed[name] = _published_fingerprint(self.root / name, step)
                try:
                    write_latest(self.root, latest_pointer(manifest, name))
                except OSError as exc:  # the step is published; the pointer is only a hint
                    log_event(WARNING, "checkpoint.latest_failed", "latest.json not updated",
                              root=str(self.root), step=step, error=_err(exc))
                deleted = self._retain()
                result = ("ok", (manifest.total_bytes, len(entries)), deleted)
            except CheckpointExistsError as exc:
                result, local = ("exists", str(exc), ()), exc
            except CheckpointDurabilityError as exc:
                result, local = ("published_not_durable", str(exc), ()), exc
            except Exception as exc:  # noqa: BLE001 - reported to every rank below, chained on this one
                result, local = ("error", _err(exc), ()), local or exc
        try:
            result = _agreed(comm, result, f"publishing step {step} failed on rank 0", local)
        except CheckpointSaveError:
            self._drop_unpublished(comm, tmp)
            raise
        t_end = time.perf_counter()
        (nbytes, nfiles), deleted = result[1], result[2]
        report = SaveResult(
            step=step, path=str(self.step_dir(step)), bytes=nbytes, files=nfiles, seconds=t_end - t0,
            write_seconds=t_written - t0, hash_seconds=t_hashed - t_written, publish_seconds=t_end - t_hashed,
            deleted=tuple(deleted), cleaned_tmp=tuple(cleaned),
        )
        if comm.is_coordinator:
            log_event(INFO, "checkpoint.saved", f"published step {step}", path=report.path, bytes=nbytes,
                      files=nfiles, seconds=round(report.seconds, 4), deleted=list(deleted))
        return report

    def _set_aside_refused(self, step: int) -> None:
        """(rank 0) Rename an existing ``step-F`` aside when it was refused (by a restore or
        `published_problem` in this process, or its structure fails now), so that F is saved again:
        refusing to overwrite it forever made one corrupt step a restart loop (the replay reaches F,
        its save fails, the job fails stop, restores the older step again). A step that verifies
        stays, and the save is refused as before (CheckpointExistsError)."""
        name = step_dir_name(step)
        if not (self.root / name).exists():
            return
        why = self._refused.get(name)
        if why is None:
            verdict = self._verify(name, hash_files=False)
            why = verdict.reason if not verdict.ok and verdict.damaged else None
        if why is None:
            return
        aside = set_aside(self.root, step, self.attempt)
        self._refused.pop(name, None)
        self._hashed.pop(name, None)
        log_event(WARNING, "checkpoint.refused_set_aside", f"refused step {step} renamed aside to save it again",
                  root=str(self.root), candidate=name, moved_to=aside, reason=why)

    def published_problem(self, step: int) -> str | None:
        """(every rank) Why the published ``step-<step>`` would be refused by a restore, or None:
        its structure and every rank's stripe of its digests, as a restore checks them. Remembered
        when refused, so that the next save of ``step`` sets it aside. For a save refused with
        CheckpointExistsError: is the step already there one to rely on?"""
        comm = self._comm()
        name = step_dir_name(step)
        why, damaged = self._stripes_agreed(comm, name)
        if why is not None and damaged:
            self._refused[name] = why
            if comm.is_coordinator:
                log_event(WARNING, "checkpoint.refused", "published step refused", root=str(self.root),
                          candidate=name, reason=why)
        return why

    def set_aside_at_next_save(self, step: int) -> bool:
        """Whether this process refused the published ``step-<step>`` for damage, so that its next
        save renames it aside and publishes afresh (a refusal for any other reason, such as another
        run's step or an I/O error, leaves it where it is and the save refused)."""
        return step_dir_name(step) in self._refused

    @staticmethod
    def _drop_unpublished(comm: Comm, tmp: Path) -> None:
        """(rank 0) Remove a save's directory that will not be published now, not at the next save:
        after a full disk it held the space the next save needs."""
        if comm.is_coordinator:
            shutil.rmtree(tmp, ignore_errors=True)

    def _retention_verdict(self, name: str) -> bool | None:
        """Known bad (False) when its structure fails (cheap: no file is read but the manifest),
        known good (True) when this process also hashed it and its files did not change since,
        else unknown (None)."""
        if not self._verify(name, hash_files=False).ok:
            return False
        return True if self._hashed_unchanged(name) else None

    def _hashed_unchanged(self, name: str) -> bool:
        try:
            return self._hashed.get(name) == tree_fingerprint(self.root / name)
        except OSError:
            return False

    def _retain(self) -> tuple[str, ...]:
        """(rank 0) Apply retention; failures are logged, never fatal to an already published save.
        A step this process has not hashed since its files last changed is *unknown* to retention
        (`retention_plan`), never read here: after a restart that was every step but the restored
        one, and rank 0 re-reading them held its peers in the save's last collective past their
        bound (the data and control timeouts) for any checkpoint past a few GB."""
        try:
            listing = classify_entries(os.listdir(self.root))
            verdicts = [(step, name, self._retention_verdict(name)) for step, name in listing.steps]
            verdicts += [(step, name, False) for step, name in listing.refused]  # set aside: known bad
            plan = retention_plan(verdicts, self.keep, self.keep_every)
            failures = delete_steps(self.root, plan.delete)
            for name in plan.delete:
                self._hashed.pop(name, None)
            if plan.delete or failures:
                log_event(INFO if not failures else WARNING, "checkpoint.retention", "deleted old steps",
                          root=str(self.root), deleted=list(plan.delete), kept=list(plan.keep), failures=failures)
            return plan.delete
        except Exception as exc:  # noqa: BLE001
            log_event(WARNING, "checkpoint.retention_failed", "retention skipped", root=str(self.root),
                      error=_err(exc))
            return ()

    # -- load ----------------------------------------------------------------------------------

    def _select(self, refused: dict[str, tuple[str, bool]] | None = None) -> Selection:
        """(rank 0) Decide which step to restore, logging every refusal: every check but the
        content's digests, which every rank then takes a stripe of (`_stripes_agreed`); `refused`:
        candidates the ranks' digests refused already, with why and whether as damaged."""
        refused = refused or {}
        names = os.listdir(self.root) if self.root.is_dir() else []
        listing = classify_entries(names)
        if listing.tmps:
            log_event(INFO, "checkpoint.tmp_ignored", "ignoring unpublished save directories",
                      root=str(self.root), dirs=list(listing.tmps))
        latest = _read_latest(self.root / LATEST_NAME)

        def verify(name: str) -> Verdict:
            if name in refused:  # logged when the ranks refused it
                why, damaged = refused[name]
                return Verdict(False, why, damaged=damaged)
            verdict = self._verify(name, hash_files=False)
            if not verdict.ok:
                log_event(WARNING, "checkpoint.refused", "checkpoint candidate refused",
                          root=str(self.root), candidate=name, reason=verdict.reason)
            return verdict

        sel = select_candidate(listing.candidates, verify, run_id=self.run_id, world_size=self.world_size,
                               layout=self.layout)
        if sel.outcome is Outcome.NO_CHECKPOINT:
            if latest is None:
                return sel
            # A pointer survives but no step does: something was published and is gone. Refuse to
            # start fresh silently.
            step, problem = latest
            reason = problem or f"latest.json points at step {step}, but no published step directory exists"
            return Selection(Outcome.NONE_VERIFIED, (Refusal(LATEST_NAME, reason),))
        note = judge_latest(latest or parse_latest(None), sel)
        if note:
            log_event(WARNING, "checkpoint.latest_ignored", "latest.json is not the step restored",
                      root=str(self.root), note=note, chosen=sel.name)
        return replace(sel, latest_note=note)

    def _stripes_agreed(self, comm: Comm, name: str) -> tuple[str | None, bool]:
        """(every rank) Hash this rank's stripe of `name`'s files against its manifest; (None, _)
        when every rank's matched, else (why, damaged), the same on every rank. Why striped: rank 0
        hashing every rank's shards alone took longer than its peers' wait for its choice (the
        control timeout) for any checkpoint past a few GB; here each rank reads 1/W of it.
        `damaged` (`verify.Verdict.damaged`): every failing rank found the step's own content
        broken, not an I/O error, another run's step or a signature that does not verify."""
        path, local = self.root / name, None
        try:
            verdict = verify_step_dir(path, hash_files=False, key=self._key)  # this rank's view of the step
            if not verdict.ok or verdict.manifest is None:
                local = (verdict.reason, verdict.damaged)
            elif verdict.manifest.run_id != self.run_id:
                local = (f"written by run {verdict.manifest.run_id!r}, this is run {self.run_id!r}", False)
            else:
                files = sorted(verdict.manifest.files, key=lambda f: f.path)[comm.rank::comm.world_size]
                bad = [f.path for f in files if sha256_file(path / f.path) != f.sha256]
                local = (f"sha256 mismatch (content corrupted): {', '.join(bad)}", True) if bad else None
        except Exception as exc:  # noqa: BLE001 - gathered below: every rank refuses alike
            local = (_err(exc), False)
        failed = [(r, got) for r, got in enumerate(comm.all_gather(local)) if got]
        if not failed:
            if comm.is_coordinator:  # retention counts it known good (`_retention_verdict`)
                try:
                    self._hashed[name] = tree_fingerprint(path)
                except OSError:
                    pass
            return None, False
        return "; ".join(f"{e} (rank {r}'s stripe)" for r, (e, _) in failed), all(d for _, (_, d) in failed)

    def load_latest(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        app_state: AppState,
    ) -> RestoreResult | None:
        """Collectively restore the newest verified checkpoint into model, optimizer and app state.

        Returns None when the root holds no checkpoint at all (a fresh start). Raises
        NoVerifiedCheckpointError when candidates exist but none verifies, and
        CheckpointLayoutError (before loading anything) when the newest verified one was written by
        another world size or layout; the same on every rank.
        """
        t0 = time.perf_counter()
        comm = self._comm()
        refused: dict[str, tuple[str, bool]] = {}  # candidates the ranks' digests refused: why, damaged
        scan_exc: Exception | None = None
        while True:  # each round refuses one more candidate, or ends
            sel: Selection | tuple[str, str] | None = None
            if comm.is_coordinator:
                try:
                    sel = self._select(refused)
                except Exception as exc:  # noqa: BLE001 - reported to every rank below, chained on this one
                    sel, scan_exc = ("error", _err(exc)), exc
            sel = comm.broadcast(sel)
            if isinstance(sel, tuple) or sel.outcome is not Outcome.SELECTED:
                break
            assert sel.name is not None
            why, damaged = self._stripes_agreed(comm, sel.name)
            if why is None:
                break
            refused[sel.name] = (why, damaged)
            if comm.is_coordinator:
                log_event(WARNING, "checkpoint.refused", "checkpoint candidate refused", root=str(self.root),
                          candidate=sel.name, reason=why)
        t_verified = time.perf_counter()
        if isinstance(sel, tuple):
            raise_from_local(CheckpointLoadError(f"rank 0 could not scan {self.root}: {sel[1]}"), scan_exc)
        assert sel is not None
        # a save of a step refused as damaged sets it aside; another run's, an unreadable or an unsigned one stays
        self._refused.update((r.candidate, r.reason) for r in sel.refusals if r.damaged)
        if sel.outcome is Outcome.NO_CHECKPOINT:
            if comm.is_coordinator:
                log_event(INFO, "checkpoint.none", "no checkpoint to restore: fresh start", root=str(self.root))
            return None
        if sel.outcome is Outcome.NONE_VERIFIED:
            raise NoVerifiedCheckpointError(str(self.root), sel.refusals)
        if sel.outcome is Outcome.LAYOUT_MISMATCH:
            raise CheckpointLayoutError(
                f"refusing to load {self.root / str(sel.name)}: {sel.message}; nothing was loaded",
                step=int(sel.step or 0), saved=str(sel.saved_layout), current=str(sel.current_layout),
            )
        assert sel.name is not None and sel.step is not None
        path = self.root / sel.name

        # Every rank reads its own (verified) state file and checks it fits, before touching the model.
        payload: dict[str, Any] = {}
        local: Exception | str | None = None
        try:
            payload = torch.load(path / rank_state_name(comm.rank), map_location="cpu", weights_only=True)
            local = _rank_payload_problem(payload, comm.rank, comm.world_size, sel.step, self.run_id)
            local = local or app_state.problem(payload["app"])
        except Exception as exc:  # noqa: BLE001 - gathered, raised on every rank (chained on this one)
            local = exc
        comm.agree(local, f"reading rank state of {sel.name}", CheckpointLoadError)

        local = None
        try:
            load_shards(path / SHARDS_DIR, model, optimizer, comm)
            app_state.restore(payload["app"])  # its errors name the component (data cursor, scheduler...)
        except Exception as exc:  # noqa: BLE001 - DCP already agrees on its own failures; this covers the rest
            local = exc
        comm.agree(local, f"restoring {sel.name} (model, optimizer, app state)", CheckpointLoadError)

        manifest = verify_step_dir(path, hash_files=False, key=self._key).manifest
        report = RestoreResult(
            step=sel.step, path=str(path), frontier=app_state.frontier, opt_step=app_state.opt_step,
            saved_attempt=str(payload.get("attempt", "")), refused=sel.refusals, latest_note=sel.latest_note,
            bytes=manifest.total_bytes if manifest else 0, seconds=time.perf_counter() - t0,
            verify_seconds=t_verified - t0,
        )
        if comm.is_coordinator:
            log_event(INFO, "checkpoint.restored", f"restored step {sel.step}", path=str(path),
                      refused=[r.to_dict() for r in sel.refusals], latest_note=sel.latest_note,
                      seconds=round(report.seconds, 4))
        return report

    # -- inspection ----------------------------------------------------------------------------

    def verified_steps(self) -> list[int]:
        """Steps under root that pass full verification now, ascending (local: no collectives)."""
        if not self.root.is_dir():
            return []
        listing = classify_entries(os.listdir(self.root))
        return sorted(step for step, name in listing.steps if self._verify(name).ok)


def _published_fingerprint(path: Path, step: int) -> tuple:
    """Fingerprint of a step just published from freshly computed digests (sizes re-checked). It
    is published by now: a failure here is a CheckpointDurabilityError, not a failed save."""
    try:
        fingerprint = tree_fingerprint(path)
    except OSError as exc:
        raise published_not_durable(path, step, "reading its files back failed", exc) from exc
    verdict = verify_step_dir(path, hash_files=False)
    if not verdict.ok:
        problem = CheckpointError(verdict.reason)
        raise published_not_durable(path, step, "it does not verify", problem) from problem
    return fingerprint


def _read_latest(path: Path) -> tuple[int | None, str | None] | None:
    """(step, problem) of latest.json, or None when there is none. A pointer that cannot be read
    (EIO) is a problem noted like a torn one: it is a hint, and must not stop the restore."""
    try:
        return parse_latest(path.read_bytes())
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError as exc:
        return None, f"latest.json unreadable ({type(exc).__name__}: {exc})"


def _rank_payload_problem(payload: Any, rank: int, world_size: int, step: int, run_id: str) -> str | None:
    """Why a rank-state file does not belong to this rank of this world and step, or None (pure)."""
    if not isinstance(payload, dict) or "app" not in payload:
        return "rank state file has no 'app' entry"
    expect = {"rank": rank, "world_size": world_size, "step": step, "run_id": run_id}
    wrong = [f"{k}={payload.get(k)!r} (expected {v!r})" for k, v in expect.items() if payload.get(k) != v]
    app = payload["app"]
    if isinstance(app, dict) and app.get("frontier") != step:
        wrong.append(f"app frontier={app.get('frontier')!r} (expected {step})")
    return f"rank state file does not match: {', '.join(wrong)}" if wrong else None
