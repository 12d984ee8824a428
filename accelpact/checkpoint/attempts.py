"""Restart attempts: a durable record of every restore and fail-stop, and the restart budget.

torchrun restarts a failed worker group and numbers the attempt in TORCHELASTIC_RESTART_COUNT.
That counter resets when a job is resubmitted, and a pod's restart count is not the training's
recovery count (seed 004 §13, §17, §18), so each attempt is also appended as one JSON line to
``<root>/attempts.jsonl`` (rank 0 only; fsynced; never rewritten, so a final success does not
erase earlier failures). The budget check counts both, and stops a run that keeps failing
instead of retrying forever.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RestartBudgetExceeded
from .events import log_event
from .fsio import append_durable

if TYPE_CHECKING:
    from .manager import RestoreResult

ATTEMPTS_NAME = "attempts.jsonl"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"

FAIL_STOP = "fail_stop"
RESTORED = "restored"
FRESH_START = "fresh_start"
SAVE_FAILED = "save_failed"
#: written by the next attempt for one that ended without its fail-stop on record (a crash, a
#: kill, rank 0 stopped before it wrote): the log never shows a failed attempt as a clean one
ENDED_UNRECORDED = "ended_unrecorded"
#: rank 0 at the start of every attempt: a launch that wrote nothing else (no restore asked for)
#: is still on record, so the next launch can tell that it ended without a word
STARTED = "started"
#: rank 0 at `rt.close()`: the script ended its training itself. A launch whose last line is not
#: one of these ends (a crash, a kill, a node lost) is counted as a failure by the next launch
FINISHED = "finished"
#: written by the next launch for one that ended without an end line but saved a newer step than it
#: started from (a preemption, a wall-clock limit, a requeue): progress, so not counted as a failure
ENDED_AFTER_PROGRESS = "ended_after_progress"
#: the lines an attempt's end leaves; any other last line of a launch means it ended unrecorded
ENDS = (FAIL_STOP, ENDED_UNRECORDED, FINISHED, ENDED_AFTER_PROGRESS)


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """This attempt's number from torchrun (0 for the first, or when not under torchrun)."""
    raw = (os.environ if env is None else env).get(RESTART_ENV, "0").strip() or "0"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{RESTART_ENV}={raw!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{RESTART_ENV}={value} is negative")
    return value


def last_recorded_run(root: str | os.PathLike[str]) -> str | None:
    """The run of the newest readable line of `root`'s attempts log (None: no log, or no line).
    What a launch takes for its run before any step is published (`checkpointing.run_identity`)."""
    try:
        records = AttemptLog(root, run_id="", attempt=0).records(all_runs=True)
    except OSError as exc:  # every rank asks before a collective: none may raise alone (found by review)
        log_event(logging.WARNING, "checkpoint.attempt.unreadable", "the attempts log cannot be read to name the run",
                  path=str(Path(root) / ATTEMPTS_NAME), error=f"{type(exc).__name__}: {exc}")
        return None
    return records[-1].run_id if records else None


def updates_replayed(failure_frontier: int | None, checkpoint_step: int | None) -> int | None:
    """A = F - C: committed updates lost at the failure that the restart must run again (pure)."""
    if failure_frontier is None or checkpoint_step is None:
        return None
    return max(0, failure_frontier - checkpoint_step)


@dataclass(frozen=True)
class AttemptRecord:
    """One line of attempts.jsonl."""

    run_id: str
    attempt: int
    event: str  # started | restored | fresh_start | save_failed | fail_stop | ended_unrecorded | finished
    time: str
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    updates_replayed: int | None = None
    restore_seconds: float | None = None
    frontier: int | None = None  # fail_stop: committed frontier when the attempt gave up; save_failed: its step
    reason: str | None = None
    refused: tuple[dict[str, str], ...] = ()
    host: str = field(default_factory=platform.node)
    #: the launch it belongs to (`launch.current_launch`; None: unknown, or written before it was
    #: recorded): attempts count from 0 again in every launch of a run
    launch: str | None = None

    def to_json(self) -> str:
        doc = asdict(self)
        doc["refused"] = list(self.refused)
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AttemptRecord:
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        known["refused"] = tuple(known.get("refused") or ())
        return cls(**known)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AttemptLog:
    """Append-only attempts.jsonl in a checkpoint root, for one run. Call its writers on rank 0 only."""

    def __init__(self, root: str | os.PathLike[str], *, run_id: str, attempt: int | None = None,
                 launch: str | None = None) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.attempt = restart_count() if attempt is None else attempt
        self.launch = launch

    @property
    def path(self) -> Path:
        return self.root / ATTEMPTS_NAME

    def append(self, record: AttemptRecord) -> AttemptRecord:
        if record.launch is None and self.launch is not None:
            record = replace(record, launch=self.launch)
        self.root.mkdir(parents=True, exist_ok=True)
        append_durable(self.path, (record.to_json() + "\n").encode("utf-8"))
        log_event(logging.INFO, f"checkpoint.attempt.{record.event}", f"attempt {record.attempt} recorded",
                  **{k: v for k, v in asdict(record).items() if k != "event" and v not in (None, (), [])})
        return record

    def records(self, *, all_runs: bool = False) -> list[AttemptRecord]:
        """Records of this run (or of every run), oldest first; torn lines are skipped with a warning."""
        if not self.path.is_file():
            return []
        out = []
        # bytes, decoded line by line: one torn or foreign line of non-UTF-8 bytes is skipped like any
        # other unreadable line, instead of failing the budget check of every later attempt
        for lineno, line in enumerate(self.path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = AttemptRecord.from_dict(json.loads(line.decode("utf-8")))
            except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as exc:
                log_event(logging.WARNING, "checkpoint.attempt.bad_line", "skipping unreadable attempts line",
                          path=str(self.path), line=lineno, error=str(exc))
                continue
            if all_runs or rec.run_id == self.run_id:
                out.append(rec)
        return out

    def fail_stops(self) -> int:
        return sum(1 for r in self.records() if r.event == FAIL_STOP)

    def failures_of_other_launches(self) -> int | None:
        """Attempts of this run's other launches that failed (a fail-stop, or an end the next
        attempt or launch recorded); None without this launch's identity (not under torchrun),
        where no line can be told apart from this launch's own."""
        if self.launch is None:
            return None
        return sum(1 for r in self.records() if r.event in (FAIL_STOP, ENDED_UNRECORDED) and r.launch != self.launch)

    def last_failure_frontier(self) -> int | None:
        """The frontier the latest failed attempt gave up at; None when it is not known (none
        failed, or the latest ended without a record)."""
        ends = [r for r in self.records() if r.event in (FAIL_STOP, ENDED_UNRECORDED)]
        return ends[-1].frontier if ends else None

    def note_unrecorded_end(self, saved_by: Callable[[str], int | None] | None = None) -> AttemptRecord | None:
        """At the start of an attempt: record the one before it as ended without a record when it
        left no end line. A restart (attempt > 0) looks at this launch's previous attempt
        (torchrun restarted it, so it failed); a launch's first attempt looks at the last line of
        the run's previous launch (found by review: under the spares recipe, where a scheduler
        relaunches and every launch is attempt 0, a crash loop was never counted). `saved_by(launch)`:
        the newest step published now that `launch` saved (`_note_previous_launch`)."""
        if self.attempt == 0:
            return self._note_previous_launch(saved_by)
        previous = self.attempt - 1
        # of this launch: found by review, an earlier launch's fail-stop of the same number (they
        # count from 0 again) hid this launch's crash
        if previous < 0 or any(r.attempt == previous and r.event == FAIL_STOP and r.launch == self.launch
                               for r in self.records()):
            return None
        return self.append(AttemptRecord(
            self.run_id, previous, ENDED_UNRECORDED, _now(),
            reason=f"attempt {previous} ended without a fail-stop record (a crash, a kill, or rank 0 stopped "
                   "before it wrote one); its frontier is unknown",
        ))

    def _note_previous_launch(self, saved_by: Callable[[str], int | None] | None) -> AttemptRecord | None:
        """A launch that saved past the step it started from made progress (found by review: a
        healthy chain of preempted, requeued launches spent the budget) and is noted as such, not
        counted; one that did not is a failure. What it saved is asked of the steps themselves
        (`saved_by`: each manifest names the launch that wrote it), not read off their names:
        found by review, a newer step the launch had refused (corrupt) and restored past counted
        as its progress, and a crash loop below it was never counted."""
        records = self.records()
        last = records[-1] if records else None
        # a line without a launch was written outside torchrun (or before launches were recorded):
        # nothing says whether it is another launch's
        if last is None or last.launch is None or last.launch == self.launch or last.event in ENDS:
            return None
        its = [r for r in records if r.launch == last.launch]
        started_at = next((r.checkpoint_step if r.event == RESTORED else 0 for r in reversed(its)
                           if r.event in (RESTORED, FRESH_START)), None)
        newest_step = saved_by(last.launch) if saved_by is not None else None
        if newest_step is not None and started_at is not None and newest_step > started_at:
            return self.append(AttemptRecord(
                self.run_id, last.attempt, ENDED_AFTER_PROGRESS, _now(), launch=last.launch, checkpoint_step=newest_step,
                reason=f"launch {last.launch} ended at attempt {last.attempt} without an end line after saving step "
                       f"{newest_step} (it started from {started_at}): a preemption or a requeue, not counted"))
        return self.append(AttemptRecord(
            self.run_id, last.attempt, ENDED_UNRECORDED, _now(), launch=last.launch,
            reason=f"launch {last.launch} ended at attempt {last.attempt} without a fail-stop or a finish record "
                   "(a crash, a kill, a lost node, or a script that never called rt.close()); its frontier is unknown",
        ))

    def record_started(self) -> AttemptRecord:
        return self.append(AttemptRecord(self.run_id, self.attempt, STARTED, _now()))

    def record_finished(self, frontier: int) -> AttemptRecord:
        """The script closed its runtime after its last update: a later launch is a resubmission."""
        return self.append(AttemptRecord(self.run_id, self.attempt, FINISHED, _now(), frontier=frontier))

    def record_fail_stop(self, frontier: int, reason: str) -> AttemptRecord:
        """The runtime rejected in-memory recovery (L2): note the frontier being abandoned."""
        return self.append(AttemptRecord(self.run_id, self.attempt, FAIL_STOP, _now(), frontier=frontier,
                                         reason=reason))

    def record_save_failed(self, frontier: int, reason: str) -> AttemptRecord:
        """A save failed on every rank alike and training went on without it (`failed_saves`)."""
        return self.append(AttemptRecord(self.run_id, self.attempt, SAVE_FAILED, _now(), frontier=frontier,
                                         reason=reason))

    def record_restore(self, report: RestoreResult, *, failure_frontier: int | None = None) -> AttemptRecord:
        """A restart restored ``report``'s checkpoint; replayed updates use the last fail-stop frontier."""
        frontier = self.last_failure_frontier() if failure_frontier is None else failure_frontier
        return self.append(AttemptRecord(
            self.run_id, self.attempt, RESTORED, _now(), checkpoint_step=report.step,
            checkpoint_path=report.path, updates_replayed=updates_replayed(frontier, report.step),
            restore_seconds=report.seconds, refused=tuple(r.to_dict() for r in report.refused),
        ))

    def record_fresh_start(self) -> AttemptRecord:
        return self.append(AttemptRecord(self.run_id, self.attempt, FRESH_START, _now()))


def check_restart_budget(
    max_restarts: int, *, attempt: int | None = None, log: AttemptLog | None = None
) -> int:
    """Raise RestartBudgetExceeded once this run has restarted more than ``max_restarts`` times.

    Restarts used = torchrun's attempt number (this launch's failures) + the failed attempts of
    the run's other launches on record in ``log``, and never fewer than the fail-stops recorded.
    Without a launch identity (not under torchrun) the log's lines cannot be told apart by launch:
    max(attempt number, fail-stops recorded). Returns that number when still within budget.
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    current = restart_count() if attempt is None else attempt
    recorded = log.fail_stops() if log is not None else 0
    earlier = log.failures_of_other_launches() if log is not None else None
    used = max(current + (earlier or 0), recorded)
    if used > max_restarts:
        run = f" of run {log.run_id!r}" if log is not None else ""
        launches = f", {earlier} failed attempts of earlier launches" if earlier else ""
        msg = (f"restart budget exceeded{run}: {used} restarts used (attempt {current} from {RESTART_ENV}, "
               f"{recorded} fail-stops recorded{launches}) > max_restarts={max_restarts}; stopping instead of retrying "
               "- inspect the failures, then resubmit with a larger max_restarts (ACCELPACT_MAX_RESTARTS): "
               "a resubmitted run goes on from its checkpoints and counts the fail-stops it recorded")
        log_event(logging.ERROR, "checkpoint.restart_budget_exceeded", msg, used=used, max_restarts=max_restarts)
        raise RestartBudgetExceeded(msg, used=used, max_restarts=max_restarts, attempt=current, recorded=recorded)
    return used
