"""The runtime's L2 fallback: verified checkpoints every K committed updates, restore on restart,
attempt records and the restart budget.

Thin glue between the runtime and `accelpact.checkpoint`: saves happen right after a commit (every
rank committed the same update, so every rank saves the same step), restores happen at attach,
and a Reject records the abandoned frontier so the next attempt can report what it replayed.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from ..checkpoint import (
    AppState,
    AttemptLog,
    CheckpointExistsError,
    CheckpointManager,
    CheckpointSaveError,
    RestoreResult,
    SaveResult,
    agreed_failure,
    check_restart_budget,
)
from ..checkpoint.attempts import last_recorded_run
from ..checkpoint.failed_saves import FailedSaveVerdict, judge_failed_save
from ..checkpoint.manifest import parse_manifest
from ..checkpoint.naming import MANIFEST_NAME, classify_entries
from ..checkpoint.selection import recorded_run
from ..errors import ControlPlaneError, RestartBudgetExceeded
from ..fsm.phases import RecoveryAction
from ..launch import current_launch

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("accelpact.checkpointing")

#: the mark rank 0 sets once the fail-stop is on disk, and how long the other ranks wait for it
#: before they exit anyway (rank 0 may be the rank that is gone)
FAIL_STOP_RECORDED = "fail-stop-recorded"
FAIL_STOP_WAIT_S = 5.0
#: How long each collective of a restore may wait: every rank hashes its stripe of the chosen step,
#: then DCP reads it, and ranks finish those at different times; the control timeout (seconds)
#: failed any checkpoint past a few GB. A restore runs at attach, before any training, where a
#: rank that died is seen by torchrun's agent, which stops the whole group: a long bound costs
#: nothing unless the file system itself hangs.
RESTORE_TIMEOUT_S = 1800.0


def run_identity(given: str | None, root: str) -> str:
    """Whose checkpoints these are: the id given (`Config.run_id`, ACCELPACT_RUN_ID), else the run
    that wrote the newest step under `root`, else the run of the root's attempts log's last line,
    else torchrun's TORCHELASTIC_RUN_ID, else "accelpact".
    Why the root's before torchrun's: `torchrun --standalone` draws a new id at every launch, so a
    job launched again (a requeue, a restart budget spent) refused every step it had written
    ("written by run ...") and could neither resume nor start. Why the attempts log's too: before
    the first step is published, every launch took a new id, and each read the log as another
    run's: a crash loop before the first checkpoint was never counted (found by review)."""
    return (given or recorded_run(root) or last_recorded_run(root) or os.environ.get("TORCHELASTIC_RUN_ID")
            or "accelpact")


class Checkpointer:
    def __init__(self, rt: Runtime):
        cfg = rt.config
        assert cfg.checkpoint_dir is not None
        self.rt = rt
        self.every = cfg.checkpoint_every
        layout = {
            "profile": rt.profile,
            "groups": sorted(gid.key for gid in rt.data_plane.held()),
        }
        # Each rank knows only its own groups; the layout must name the whole job's shape, so
        # gather every rank's groups (once, at attach) into one description. Rank 0's run id rides
        # along: every rank takes it.
        mine = {"groups": layout["groups"], "run": run_identity(cfg.run_id, cfg.checkpoint_dir)}
        gathered = rt.control.gather(mine)
        unusable = rt.control.unusable(gathered)
        if unusable:  # every rank sees it: all refuse the layout together
            raise ControlPlaneError("the checkpoint layout does not fit the control plane: " + "; ".join(unusable))
        layout["groups"] = sorted({g for per_rank in gathered for g in per_rank["groups"]})
        self.run_id = str(gathered[0]["run"])
        self.manager = CheckpointManager(
            cfg.checkpoint_dir, run_id=self.run_id, world_size=rt.world_size, layout=layout,
            keep=cfg.checkpoint_keep, group=rt.control.group, attempt=rt.attempt, key=cfg.checkpoint_key,
        )
        self.manager.notes["shrinks"] = rt.shrinks  # the experiment's changes, kept in every manifest
        # who saved each step: the next launch asks whether this one made progress (`saved_by`)
        self.manager.notes["launch"] = current_launch()
        self.attempts = AttemptLog(cfg.checkpoint_dir, run_id=self.run_id, attempt=rt.attempt, launch=current_launch())
        self.finished = False  # the end of training is on record (`record_finished`)
        self.saves: list[dict] = []
        self.failed: list[dict] = []  # saves that failed on every rank alike and were gone on from
        self.in_a_row = 0  # failed saves since the last one that published
        #: F when a membership change interrupted the save due at F (this rank's presence says so)
        self.interrupted_at: int | None = None
        self.restored: RestoreResult | None = None

    def app_state(self) -> AppState:
        """What a checkpoint holds besides the tensors: the frontier, the data cursor, and the
        schedulers and scalers the update steps (the ones a Rewind puts back): without them a
        restart resumed at the right update with the LR warmup and the loss scale reset."""
        return AppState(frontier=self.rt.frontier, opt_step=self.rt.opt_step, data_state=self.rt.data_state,
                        stateful=tuple(self.rt.rewind.stateful))

    def enforce_budget(self) -> None:
        """RestartBudgetExceeded past the budget (`fail_stop` turns it into the exit); within it,
        rank 0 records the attempt's start. After the check: an attempt the budget stopped did
        not run, and a resubmission must not count it as one that failed."""
        self._budget_verdict_of_rank_0()
        if self.rt.rank == 0:
            self._record(self.attempts.record_started, "this attempt's start")

    def _budget_verdict_of_rank_0(self) -> None:
        """Rank 0 counts (it has just noted how the previous attempt ended); every rank follows its
        verdict. Found by review: a rank that read the log before rank 0's note landed passed where
        rank 0 stopped, and went on into the restore without it (its agent waited the rendezvous)."""
        verdict: RestartBudgetExceeded | None = None
        if self.rt.rank == 0:
            try:
                verdict = self._counted(self.attempts)
            except OSError as exc:  # rank 0 must reach the gather below, or its peers wait there
                log.error("could not read %s to count the restarts of earlier launches (%s: %s): counting this "
                          "launch's attempts only", self.attempts.path, type(exc).__name__, exc)
                verdict = self._counted(None)
        used = float(verdict.context.get("used", 0)) if verdict is not None else -1.0
        agreed = self.rt.control.gather_floats([used])[0][0]
        if verdict is not None:
            raise verdict
        if agreed >= 0:
            raise RestartBudgetExceeded(
                f"restart budget exceeded: rank 0 counted {int(agreed)} restarts used > max_restarts="
                f"{self.rt.config.max_restarts} (its log and {self.attempts.path} say which); stopping instead of "
                "retrying", used=int(agreed), max_restarts=self.rt.config.max_restarts, attempt=self.rt.attempt)

    def _counted(self, attempts: AttemptLog | None) -> RestartBudgetExceeded | None:
        try:
            check_restart_budget(self.rt.config.max_restarts, attempt=self.rt.attempt, log=attempts)
        except RestartBudgetExceeded as exc:
            return exc
        return None

    def record_finished(self) -> None:
        """Rank 0, at `rt.close()` (`detach`): the end of training, once, so that the run's next
        launch (a resubmission) counts no failure for this one. Not while an exception is in
        flight (a deferred boundary that rejected in close, a failed attach, a close in the
        script's `finally` or `except`), nor after a reject: those ended in a failure; nor in a
        process fenced out of the job or gone with a shrink (its position, if any, ends elsewhere)."""
        rejected = bool(self.rt.history) and self.rt.history[-1].action is RecoveryAction.REJECT
        # fenced, or left with its replica group: the job goes on without this process (found by review)
        gone = getattr(getattr(self.rt, "membership", None), "finished", False)
        if self.rt.rank != 0 or self.finished or rejected or gone or sys.exc_info()[1] is not None:
            return
        self.finished = True
        self._record(lambda: self.attempts.record_finished(self.rt.frontier), "the end of training")

    def restore(self) -> RestoreResult | None:
        """Load the newest verified checkpoint into model, optimizer, RNG and data cursor."""
        state = self.app_state()
        with self.rt.control.timeout_for(max(RESTORE_TIMEOUT_S, self.rt.control.timeout_s)):
            report = self.manager.load_latest(model=self.rt.model, optimizer=self.rt.optimizer, app_state=state)
        if report is None:
            if self.rt.rank == 0 and self.rt.attempt == 0:
                self._record(self.attempts.record_fresh_start, "a fresh start")
            return None
        self.rt.frontier = report.frontier
        self.rt.opt_step = report.opt_step
        self.rt.update_index = report.frontier
        self.restored = report
        if self.rt.rank == 0 and (rec := self._record(lambda: self.attempts.record_restore(report),
                                                      "the restore")) is not None:
            log.warning(
                "restored step %d (attempt %s): %s updates to replay, %.3fs, %d candidates refused",
                report.step, self.rt.attempt, rec.updates_replayed, report.seconds, len(report.refused),
            )
        return report

    def _record(self, write, what: str):
        """Rank 0's attempts-log writes: a failure is logged, never raised. The storage that failed
        a save may fail this too, and rank 0 alone raising strands its peers (found by review: a
        full disk raised after the restore's last collective, and its peers waited in the line-up
        until the control timeout, at every restart)."""
        try:
            return write()
        except OSError as exc:
            log.error("could not record %s: could not write to %s: %s: %s", what, self.attempts.path,
                      type(exc).__name__, exc)
            return None

    def due(self, frontier: int) -> bool:
        """Whether the commit of `frontier` is followed by a save (every rank alike)."""
        return bool(self.every) and frontier % self.every == 0

    def after_commit(self, rt: Runtime, *, owed: bool = False) -> None:
        """The save due at F; `owed`: the save of F a membership change interrupted, taken by the
        new world whether or not F is due (`after_commit.take_owed_save`)."""
        if not (owed or self.due(rt.frontier)):
            return
        t = time.perf_counter()
        try:
            report = self._save_over_refused(rt)
        except CheckpointExistsError as exc:
            if not owed:
                self._failed(rt, t, exc)
                raise
            # rank 0 published it before the loss reached it, and it verifies (`_save_over_refused`): done
            log.warning("checkpoint step %d owed by the membership change was already published", rt.frontier)
            self.in_a_row = 0
            rt.trace.write({"kind": "checkpoint", "step": rt.frontier, "seconds": time.perf_counter() - t,
                            "owed": True, "published_before": True})
            return
        except Exception as exc:
            self._failed(rt, t, exc)
            raise
        save = {"step": report.step, "bytes": report.bytes, "seconds": time.perf_counter() - t}
        self.saves.append(save)
        self.in_a_row = 0
        # when it ran: a stall inside it is told apart (chaos); `owed`: taken after a membership change
        rt.trace.write({"kind": "checkpoint", **save, **({"owed": True} if owed else {})})
        rt.observers.checkpoint(report.step, None)

    def _save_over_refused(self, rt: Runtime) -> SaveResult:
        """Save F; when step F is already there, verify it (every rank hashes its stripe, as a
        restore does) and save again if it fails: the manager then sets it aside. What is left to
        raise CheckpointExistsError is a step F that verifies: an owed save counts it as taken,
        where before a corrupt step F did too. The manager sets aside what it saw refused itself;
        this covers the rest (rank 0 published F before a membership change, which also rebuilt
        the manager). The verification gets a restore's bound, not the save's: it reads a whole
        step, and the path is rare."""
        def save() -> SaveResult:
            return self.manager.save(rt.frontier, model=rt.model, optimizer=rt.optimizer, app_state=self.app_state())

        try:
            return save()
        except CheckpointExistsError as exists:
            with rt.control.timeout_for(max(RESTORE_TIMEOUT_S, rt.control.timeout_s)):
                why = self.manager.published_problem(rt.frontier)
            if why is None:
                raise
            if not self.manager.set_aside_at_next_save(rt.frontier):
                # not damaged (another run's step, an I/O error): it stays, and this save is not
                # taken; found by review, an owed save counted it as published and verified
                raise CheckpointSaveError(
                    f"step {rt.frontier} is already published but cannot be relied on ({why}); it is not damaged, so "
                    "it is left where it is and this save is not taken", agreed=True) from exists
        log.warning("checkpoint step %d exists but does not verify (%s): it is set aside and saved again",
                    rt.frontier, why)
        return save()

    @staticmethod
    def _failed(rt: Runtime, t: float, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"[:500]
        rt.trace.write({"kind": "checkpoint", "step": rt.frontier, "seconds": time.perf_counter() - t,
                        "error": error})
        rt.observers.checkpoint(rt.frontier, error)

    def newest_step(self) -> int | None:
        """The newest checkpoint this run holds: its last save, else the one it restored."""
        if self.saves:
            return self.saves[-1]["step"]
        return self.restored.step if self.restored is not None else None

    def judge_failure(self, frontier: int, exc: BaseException) -> FailedSaveVerdict:
        """Whether training goes on without the save of `frontier` (`checkpoint.failed_saves`);
        if it does, the failure is logged on every rank and recorded in attempts.jsonl."""
        agreed = agreed_failure(exc)
        self.in_a_row += agreed
        verdict = judge_failed_save(agreed=agreed, in_a_row=self.in_a_row,
                                    tolerated=self.rt.config.checkpoint_failures_tolerated,
                                    last_saved=self.newest_step())
        if verdict.go_on:
            self.failed.append({"step": frontier, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            log.error("checkpoint save at F=%d %s: %s: %s", frontier, verdict.reason, type(exc).__name__, exc)
            if self.rt.rank == 0:
                self._record(lambda: self.attempts.record_save_failed(frontier, f"{type(exc).__name__}: {exc}"[:2000]),
                             "the failed save")
        return verdict

    def saved_by(self, launch: str) -> int | None:
        """The newest step published under the checkpoint root that `launch` saved, as its manifest
        says (not verified: only whether that launch got as far as publishing it; a step whose
        manifest cannot be read is not counted as anyone's)."""
        try:
            steps = classify_entries(os.listdir(self.attempts.root)).steps  # newest first
        except OSError:
            return None
        for step, name in steps:
            try:
                manifest = parse_manifest((self.attempts.root / name / MANIFEST_NAME).read_bytes())
            except (OSError, ValueError):  # unreadable, torn, foreign: nobody's progress
                continue
            if manifest.extra.get("launch") == launch:
                return step
        return None

    def note_previous_attempt(self) -> None:
        """Rank 0, at every start: the attempt before this one (this launch's, or at a launch's
        first attempt the run's previous launch) that died without an end line gets one."""
        if self.rt.rank != 0:
            return
        rec = self._record(lambda: self.attempts.note_unrecorded_end(saved_by=self.saved_by),
                           "how the previous attempt ended")
        if rec is not None:
            log.warning("attempt %d%s ended without a fail-stop record (%s)", rec.attempt,
                        f" of launch {rec.launch}" if rec.launch != self.attempts.launch else "", rec.event)

    def record_fail_stop(self, frontier: int, reasons: list[str]) -> None:
        """Rank 0 writes the record; the other ranks wait (bounded) until it has. torchrun stops
        every worker as soon as the first one exits, so a rank 0 a little slower than its peers
        (it also writes the incidents) would otherwise be killed before the record is on disk."""
        control = self.rt.control
        if self.rt.rank != 0:
            control.await_mark(FAIL_STOP_RECORDED, min(FAIL_STOP_WAIT_S, control.timeout_s))
            return
        self._record(lambda: self.attempts.record_fail_stop(frontier, "; ".join(reasons)[:2000]), "the fail-stop")
        try:
            control.mark(FAIL_STOP_RECORDED)
        except ControlPlaneError as exc:  # the peers wait out their bound
            log.error("could not tell the peers the fail-stop is recorded: %s", exc)
