"""The envelope file: which recovery actions were measured to work on this platform, with evidence.

`accelpact qualify` writes it; the runtime reads it. A recovery action that works on one
accelerator stack can kill the process on another (seed 000), so the file is tied to the platform
it was measured on by a fingerprint: a file from another torch, backend, device or accelpact is
*stale* and refused with a message that says how to fix it, never used. A file that cannot be
read exactly as written is *corrupt* and refused as a whole: dropping one bad row would silently
turn its key into "unknown" (or worse, change which action the runtime prefers).

The file may also carry the timeouts `accelpact qualify` derived from measured collective
latencies, with their evidence (``timeouts``, `accelpact.timeouts.DerivedTimeouts`); files
written before it have none and read as before.

Pure: torch is imported only to fingerprint the running platform.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import statistics
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..fsm.phases import FailurePhase, RecoveryAction
from ..timeouts import DerivedTimeouts
from .model import OBJECTIVE_BITWISE, PROFILES, Envelope, EnvelopeRow, ObservationKey

log = logging.getLogger("accelpact.envelope")

__all__ = [
    "FORMAT",
    "REBUILD_PROBE",
    "CorruptEnvelopeError",
    "EnvelopeFile",
    "EnvelopeFileError",
    "MissingEnvelopeError",
    "ProbeResult",
    "QualifiedRow",
    "StaleEnvelopeError",
    "compact_evidence",
    "default_envelope_path",
    "envelope_from_results",
    "load_envelope",
    "platform_fingerprint",
    "platform_key",
    "read_envelope",
    "write_envelope",
]

FORMAT = "accelpact-envelope/1"
ENVELOPE_FILENAME = "envelope.json"
OBJECTIVES = (OBJECTIVE_BITWISE,)
#: Name of the platform-level probe: retire and rebuild a group after a real timeout. Every
#: in-memory action rests on it, so when it fails only Restart is qualified.
REBUILD_PROBE = "rebuild"
#: The action each failure phase is probed for (the only in-memory action that can make sense there).
EXPECTED_ACTION: dict[FailurePhase, RecoveryAction] = {
    FailurePhase.COMMITTED: RecoveryAction.PRESERVE,
    FailurePhase.FORWARD: RecoveryAction.REWIND,
    FailurePhase.BACKWARD: RecoveryAction.REWIND,
    FailurePhase.OPTIMIZER: RecoveryAction.REWIND,
}
FRAMEWORK_PROFILES = {"fsdp2": "fsdp2-hsdp", "fsdp1": "fsdp1-hsdp", "ddp": "ddp"}


class EnvelopeFileError(ConfigError):
    """The envelope file cannot be used; the message says why and what to run."""

    def __init__(self, message: str, path: str | os.PathLike[str]):
        super().__init__(message)
        self.path = str(path)


class MissingEnvelopeError(EnvelopeFileError):
    """No envelope file: this platform has not been qualified (or not at this path)."""


class StaleEnvelopeError(EnvelopeFileError):
    """The file was qualified on another platform; ``differences`` maps field -> (file, here)."""

    def __init__(self, message: str, path: str | os.PathLike[str],
                 differences: Mapping[str, tuple[str | None, str | None]]):
        super().__init__(message, path)
        self.differences = dict(differences)


class CorruptEnvelopeError(EnvelopeFileError):
    """The file is not a well-formed envelope; refused whole rather than partly used."""


# ------------------------------------------------------------------------------------- platform


def platform_key(backend: str, device: str) -> str:
    """The envelope's platform name, spelled as `runtime.detect_platform` spells it."""
    return f"{device}-{backend}"


def _accelpact_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("accelpact")
    except metadata.PackageNotFoundError:  # running from a source tree
        from .. import __version__

        return __version__


def platform_fingerprint(backend: str, device: str) -> dict[str, str]:
    """What a qualification is valid for: any difference makes an envelope file stale."""
    import torch

    fingerprint = {
        "torch": str(torch.__version__),
        "backend": backend,
        "device": device,
        "accelpact": _accelpact_version(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if device == "cuda":
        fingerprint["cuda"] = str(torch.version.cuda)
        try:
            fingerprint["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError) as exc:  # a CUDA build without NCCL: record it, do not fail
            log.debug("NCCL version unavailable: %s: %s", type(exc).__name__, exc)
            fingerprint["nccl"] = "unavailable"
    return fingerprint


def default_envelope_path() -> Path:
    """$ACCELPACT_ENVELOPE_DIR, else $XDG_CACHE_HOME/accelpact, else ~/.cache/accelpact; envelope.json."""
    directory = os.environ.get("ACCELPACT_ENVELOPE_DIR")
    if not directory:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(cache, "accelpact")
    return Path(directory) / ENVELOPE_FILENAME


# ------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe: ``runs`` attempts of ``action`` for (profile, phase).

    The platform probe (``action == REBUILD_PROBE``) has no profile or phase. ``bitwise`` is the
    end-state verdict against an uninterrupted reference (None where nothing is compared).
    """

    action: str
    runs: int
    passed: int
    bitwise: bool | None
    profile: str | None = None
    phase: str | None = None
    repair_s: tuple[float, ...] = ()
    detect_s: tuple[float, ...] = ()
    wall_s: float = 0.0
    requires: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def qualified(self) -> bool:
        """Every run passed and, for a training action, the end state was bitwise equal."""
        if self.runs <= 0 or self.passed != self.runs:
            return False
        return self.bitwise is not False if self.action == REBUILD_PROBE else self.bitwise is True

    def evidence(self, torch_version: str) -> dict[str, Any]:
        return {
            "qualified": self.qualified,
            "runs": self.runs,
            "passed": self.passed,
            "bitwise": self.bitwise,
            "repair_s": _stats(self.repair_s),
            "detect_s": _stats(self.detect_s),
            "wall_s": round(self.wall_s, 3),
            "torch": torch_version,
            "requires": list(self.requires),
            "failures": list(self.failures),
            "notes": list(self.notes),
        }


def _stats(values: Sequence[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {"n": len(values), "median": round(statistics.median(values), 6), "max": round(max(values), 6)}


@dataclass(frozen=True)
class QualifiedRow:
    """One row of the file: K and the actions that passed (preferred first, reject last)."""

    platform: str
    profile: str
    phase: str
    actions: tuple[str, ...]
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)
    objective: str = OBJECTIVE_BITWISE

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "profile": self.profile, "phase": self.phase,
                "objective": self.objective, "actions": list(self.actions), "evidence": self.evidence}

    def to_envelope_row(self) -> EnvelopeRow:
        key = ObservationKey(self.platform, self.profile, FailurePhase(self.phase), self.objective)
        actions = tuple(RecoveryAction(a) for a in self.actions)
        return EnvelopeRow(key, actions, compact_evidence(self.evidence), requirements(self.evidence, actions))


def requirements(evidence: Mapping[str, Any], actions: Iterable[RecoveryAction]
                 ) -> tuple[tuple[RecoveryAction, tuple[str, ...]], ...]:
    """(action, conditions) for each of `actions` whose probe evidence says it passed only under
    conditions ("requires"): the row then qualifies it only where a run meets them."""
    found = []
    for action in actions:
        item = evidence.get(action.value)
        needs = item.get("requires") if isinstance(item, Mapping) else None
        if needs:
            found.append((action, tuple(needs)))
    return tuple(found)


def envelope_from_results(
    results: Iterable[ProbeResult],
    platform: str,
    *,
    torch_version: str = "",
    profiles: Sequence[str] = PROFILES,
) -> list[QualifiedRow]:
    """One row per (profile, failure phase): the probed action if every run of it passed.

    Restart is always qualified (last). Without a passing platform probe nothing else is: every
    in-memory action rebuilds groups. Keys nobody probed get a reject-only row saying so, so that
    the runtime falls back to Restart with a reason instead of refusing to start.
    """
    results = list(results)
    platform_probes = [r for r in results if r.action == REBUILD_PROBE]
    rebuild_ok = bool(platform_probes) and all(r.qualified for r in platform_probes)
    rebuild_evidence = (platform_probes[-1].evidence(torch_version) if platform_probes
                        else {"qualified": False, "failures": ["the platform probe did not run"]})
    by_key: dict[tuple[str, str], list[ProbeResult]] = {}
    for r in results:
        if r.action == REBUILD_PROBE:
            continue
        if r.profile is None or r.phase is None:
            raise ValueError(f"probe result for {r.action!r} names no profile or phase")
        probes = by_key.setdefault((r.profile, r.phase), [])
        if any(p.action == r.action for p in probes):
            raise ValueError(f"two probe results for {r.action!r} at {r.profile}/{r.phase}")
        probes.append(r)
    unknown = sorted({p for p, _ in by_key} - set(profiles))
    if unknown:
        raise ValueError(f"probe results for unknown profiles {unknown}; known: {list(profiles)}")
    rows = []
    for profile in profiles:
        for phase in FailurePhase:
            probes = by_key.get((profile, phase.value), [])
            evidence: dict[str, Any] = {}
            actions: list[str] = []
            for probe in probes:
                evidence[probe.action] = probe.evidence(torch_version)
                if probe.qualified and rebuild_ok and probe.action not in actions:
                    actions.append(probe.action)
            if probes:
                evidence[REBUILD_PROBE] = rebuild_evidence
                if not rebuild_ok and any(p.qualified for p in probes):
                    evidence["withheld"] = "the platform probe (retire and rebuild a group) failed"
            else:
                evidence["not_probed"] = ("not in this qualification; `accelpact qualify` with every framework "
                                          "and phase (the default) probes it")
            actions.append(RecoveryAction.REJECT.value)
            rows.append(QualifiedRow(platform, profile, phase.value, tuple(actions), evidence))
    return rows


def _unverified(evidence: Mapping[str, Any], action: str) -> str:
    """Why `evidence` does not back granting `action` (empty when it does): what `envelope_from_results`
    requires of a probe before it lists the action (every run passed, bitwise equal; the platform
    probe passed). A hand-edited or half-merged row could otherwise grant an action its own
    evidence denies, and dropping the evidence dropped its conditions (`requires`) with it."""
    item = evidence.get(action)
    if not isinstance(item, Mapping):
        return f"has no evidence for {action!r}"
    runs, passed = item.get("runs"), item.get("passed")
    if item.get("qualified") is not True or item.get("bitwise") is not True:
        return f"its evidence for {action!r} says qualified={item.get('qualified')!r}, bitwise={item.get('bitwise')!r}"
    if not isinstance(runs, int) or isinstance(runs, bool) or runs <= 0 or passed != runs:
        return f"its evidence for {action!r} says {passed!r} of {runs!r} runs passed"
    rebuild = evidence.get(REBUILD_PROBE)
    if not isinstance(rebuild, Mapping) or rebuild.get("qualified") is not True:
        return f"its platform probe ({REBUILD_PROBE!r}) did not pass"
    return ""


def compact_evidence(evidence: Mapping[str, Any]) -> str:
    """One line for logs and `Envelope` rows: verdict, counts and median repair of each probe."""
    parts = []
    for name, item in evidence.items():
        if not isinstance(item, Mapping):
            parts.append(f"{name}: {item}")
            continue
        text = f"{name} {item.get('passed', '?')}/{item.get('runs', '?')}"
        if item.get("bitwise") is not None:
            text += " bitwise" if item["bitwise"] else " NOT bitwise"
        repair = item.get("repair_s")
        if isinstance(repair, Mapping) and "median" in repair:
            text += f" repair~{repair['median'] * 1e3:.0f}ms"
        if item.get("requires"):
            text += f" requires {'+'.join(item['requires'])}"
        if item.get("failures"):
            text += f" ({item['failures'][0]})"
        parts.append(text)
    return "; ".join(parts) or "no evidence recorded"


# ------------------------------------------------------------------------------------- file


@dataclass(frozen=True)
class EnvelopeFile:
    """A parsed, validated envelope file."""

    path: Path
    fingerprint: dict[str, str]
    created_at: str
    rows: tuple[QualifiedRow, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    timeouts: DerivedTimeouts | None = None

    def envelope(self) -> Envelope:
        return Envelope((row.to_envelope_row() for row in self.rows), timeouts=self.timeouts)


def write_envelope(
    path: str | os.PathLike[str],
    rows: Iterable[QualifiedRow],
    fingerprint: Mapping[str, str],
    *,
    created_at: str | None = None,
    timeouts: DerivedTimeouts | None = None,
    **extra: Any,
) -> Path:
    """Write atomically (temp file + rename), so a reader never sees half a file.

    ``extra`` (JSON-serialisable: e.g. probe settings, total wall time) is kept at the top level.
    The rows are validated exactly as `read_envelope` would, so a bad file is never written.
    """
    path = Path(path)
    rows = tuple(rows)
    document = {
        "format": FORMAT,
        "platform": dict(fingerprint),
        "created_at": created_at or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rows": [row.to_json() for row in rows],
        **({"timeouts": timeouts.to_json()} if timeouts is not None else {}),
        **extra,
    }
    _parse(document, path)  # refuse to write what could not be read back
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_envelope(path: str | os.PathLike[str]) -> EnvelopeFile:
    """Parse and validate without checking the platform (to inspect a file from elsewhere)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingEnvelopeError(
            f"no qualified envelope at {path}; run `accelpact qualify --out {path}` on this platform", path
        ) from None
    except IsADirectoryError:  # not "missing": the default path would silently fall back to built-in
        raise EnvelopeFileError(f"envelope {path} is a directory, not a file; give the file's path "
                                f"(`accelpact qualify --out` writes it, by default as {ENVELOPE_FILENAME})",
                                path) from None
    except OSError as exc:  # permissions, a path through a file: say which and why, never a raw OSError
        raise EnvelopeFileError(f"envelope {path} cannot be read: {exc.strerror or exc}", path) from None
    except UnicodeDecodeError as exc:
        raise _corrupt(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"not JSON ({exc})") from None
    return _parse(document, path)


def load_envelope(path: str | os.PathLike[str], *, expect: Mapping[str, str] | None) -> Envelope:
    """The runtime's entry point: the file's `Envelope`, if it was qualified on this platform.

    ``expect`` is `platform_fingerprint` of the running platform; every field that differs is
    named. ``None`` skips the check (only for inspecting a file, never for deciding recoveries).
    """
    parsed = read_envelope(path)
    if expect is not None:
        check_fingerprint(parsed, expect)
    return parsed.envelope()


def check_fingerprint(parsed: EnvelopeFile, expect: Mapping[str, str]) -> None:
    """Raise `StaleEnvelopeError` naming every field where the file and this platform differ."""
    differences = {
        name: (parsed.fingerprint.get(name), expect.get(name))
        for name in sorted(set(parsed.fingerprint) | set(expect))
        if parsed.fingerprint.get(name) != expect.get(name)
    }
    if differences:
        said = "; for ".join(f"{name} {old or '(none)'}, this is {new or '(none)'}"
                             for name, (old, new) in differences.items())
        raise StaleEnvelopeError(
            f"envelope {parsed.path} was qualified for {said}; run `accelpact qualify --out {parsed.path}`",
            parsed.path, differences,
        )


def _corrupt(path: Path, why: str) -> CorruptEnvelopeError:
    return CorruptEnvelopeError(
        f"envelope {path} is corrupt: {why}; re-run `accelpact qualify --out {path}`", path
    )


_REQUIRED_ROW_FIELDS = ("platform", "profile", "phase", "objective", "actions", "evidence")


def _parse(document: Any, path: Path) -> EnvelopeFile:
    if not isinstance(document, dict):
        raise _corrupt(path, f"top level is a {type(document).__name__}, expected an object")
    tag = document.get("format")
    if tag != FORMAT:
        raise _corrupt(path, f"format tag is {tag!r}, expected {FORMAT!r}")
    fingerprint = document.get("platform")
    if not isinstance(fingerprint, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in fingerprint.items()
    ):
        raise _corrupt(path, "'platform' must be an object of strings (the platform fingerprint)")
    for name in ("torch", "backend", "device"):
        if name not in fingerprint:
            raise _corrupt(path, f"the platform fingerprint has no {name!r}")
    created_at = document.get("created_at")
    if not isinstance(created_at, str):
        raise _corrupt(path, "'created_at' must be a string")
    raw_rows = document.get("rows")
    if not isinstance(raw_rows, list):
        raise _corrupt(path, "'rows' must be a list")
    platform = platform_key(fingerprint["backend"], fingerprint["device"])
    rows: list[QualifiedRow] = []
    seen: dict[tuple[str, str, str, str], int] = {}
    for index, raw in enumerate(raw_rows):
        row = _parse_row(raw, index, path, platform)
        key = (row.platform, row.profile, row.phase, row.objective)
        if key in seen:
            raise _corrupt(path, f"rows {seen[key]} and {index} both cover "
                                 f"<{', '.join(key)}>")
        seen[key] = index
        rows.append(row)
    timeouts = None
    if document.get("timeouts") is not None:  # absent in files written before timeouts were measured
        try:
            timeouts = DerivedTimeouts.from_json(document["timeouts"])
        except ValueError as exc:
            raise _corrupt(path, str(exc)) from None
    extra = {k: v for k, v in document.items() if k not in ("format", "platform", "created_at", "rows", "timeouts")}
    return EnvelopeFile(path, dict(fingerprint), created_at, tuple(rows), extra, timeouts)


def _parse_row(raw: Any, index: int, path: Path, platform: str) -> QualifiedRow:
    where = f"row {index}"
    if not isinstance(raw, dict):
        raise _corrupt(path, f"{where} is a {type(raw).__name__}, expected an object")
    missing = [name for name in _REQUIRED_ROW_FIELDS if name not in raw]
    if missing:
        raise _corrupt(path, f"{where} lacks {', '.join(missing)}")
    where = f"row {index} ({raw['profile']}/{raw['phase']})"
    if raw["platform"] != platform:
        raise _corrupt(path, f"{where} is for platform {raw['platform']!r}, but the file fingerprints {platform!r}")
    if raw["profile"] not in PROFILES:
        raise _corrupt(path, f"{where}: unknown profile {raw['profile']!r}; expected one of {', '.join(PROFILES)}")
    phases = [p.value for p in FailurePhase]
    if raw["phase"] not in phases:
        raise _corrupt(path, f"{where}: unknown failure phase {raw['phase']!r}; expected one of {', '.join(phases)}")
    if raw["objective"] not in OBJECTIVES:
        raise _corrupt(path, f"{where}: unknown objective {raw['objective']!r}; expected one of "
                             f"{', '.join(OBJECTIVES)}")
    actions = raw["actions"]
    known = [a.value for a in RecoveryAction]
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise _corrupt(path, f"{where}: 'actions' must be a list of strings")
    # files written before the fail-stop action was named Reject call it "restart"
    actions = [RecoveryAction(a).value if a == "restart" else a for a in actions]
    for action in actions:
        if action not in known:
            raise _corrupt(path, f"{where}: unknown action {action!r}; expected one of {', '.join(known)}")
    if len(set(actions)) != len(actions):
        raise _corrupt(path, f"{where}: an action is listed twice in {actions}")
    if RecoveryAction.REJECT.value not in actions:
        raise _corrupt(path, f"{where}: 'reject' is missing from {actions}; reject is always allowed")
    if actions[-1] != RecoveryAction.REJECT.value:
        raise _corrupt(path, f"{where}: 'reject' must come last in {actions} (it is the fallback)")
    if not isinstance(raw["evidence"], dict):
        raise _corrupt(path, f"{where}: 'evidence' must be an object")
    for name, item in raw["evidence"].items():
        needs = item.get("requires", []) if isinstance(item, dict) else []
        if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
            raise _corrupt(path, f"{where}: evidence {name!r}: 'requires' must be a list of strings, got {needs!r}")
    for action in actions[:-1]:
        why = _unverified(raw["evidence"], action)
        if why:
            raise _corrupt(path, f"{where} grants {action!r} but {why}: a row grants only what its probes passed")
    return QualifiedRow(raw["platform"], raw["profile"], raw["phase"], tuple(actions), raw["evidence"],
                        raw["objective"])
