"""Which recovery envelope a chaos campaign's workers obey: the one a user following the README
would have, a file `accelpact qualify` wrote for this platform.

Without one the runtime falls back to the built-in envelope (Preserve at committed boundaries
only, no Rewind), and a cut that lands inside an update (backward, mostly: the only cross-node
collectives of HSDP) ends in a restart that a qualified platform would have rewound. So the
campaign looks for a usable file first and, when there is none, qualifies first, as a user would.

Decide vs effect: `plan_envelope` (pure) says what to use or that a qualification must run;
`usable_envelope` reads a file against the running platform; `resolve_envelope` runs the
qualification if the plan asks for it and checks its file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

__all__ = ["AUTO", "EnvelopePlan", "EnvelopeUnavailable", "plan_envelope", "qualify_argv", "resolve_envelope",
           "usable_envelope"]

#: Use the default envelope file if it is usable here, else qualify first.
AUTO = "auto"
QUALIFY = "qualify"
BUILTIN = "builtin"
PERMISSIVE = "permissive"


class EnvelopeUnavailable(ConfigError):
    """The envelope asked for cannot be used (stale, corrupt, missing, or the qualification failed)."""


@dataclass(frozen=True)
class EnvelopePlan:
    envelope: str  # what the workers get as Config.envelope: a file, "builtin" or "permissive"
    source: str  # where it came from, for the printout and the summary
    qualify_out: Path | None = None  # qualify first, writing this file (then it is `envelope`)

    @property
    def qualified(self) -> bool:
        """Rewind is possible only under a measured envelope file."""
        return self.envelope not in (BUILTIN, PERMISSIVE)


def plan_envelope(requested: str | None, *, default_path: Path, default_problem: str | None,
                  out: Path) -> EnvelopePlan:
    """What to use for `requested` (None or "auto", "qualify", "builtin", "permissive", or a path).

    `default_problem` is why the default file cannot be used here (None: it can). A path given
    explicitly is used as given (`resolve_envelope` checks it): a campaign that asked for a file
    must not quietly run without it. Pure."""
    if requested in (None, AUTO):
        if default_problem is None:
            return EnvelopePlan(str(default_path), f"qualified: {default_path} (the default path)")
        target = out / "envelope.json"
        return EnvelopePlan(str(target), f"qualified first: {target} (default file unusable: {default_problem})",
                            qualify_out=target)
    if requested == QUALIFY:
        target = out / "envelope.json"
        return EnvelopePlan(str(target), f"qualified first: {target}", qualify_out=target)
    if requested == BUILTIN:
        return EnvelopePlan(BUILTIN, "built-in (Preserve at committed boundaries only, no Rewind)")
    if requested == PERMISSIVE:
        return EnvelopePlan(PERMISSIVE, "permissive (every action allowed; not qualified)")
    return EnvelopePlan(str(requested), f"qualified: {requested}")


def qualify_argv(out: Path, *, python: str = sys.executable) -> list[str]:
    """`accelpact qualify --quick` for FSDP2 (the chaos trainer's framework), writing `out`. Pure."""
    return [python, "-c", "import sys; from accelpact.cli import main; sys.exit(main(sys.argv[1:]))",
            "qualify", "--quick", "--out", str(out)]


def usable_envelope(path: str | Path, *, framework: str = "fsdp2") -> str | None:
    """None if `path` is an envelope file qualified on this platform (CPU/gloo) for `framework`
    (the chaos trainer's), else why not.

    A file whose rows for the framework were never probed (`accelpact qualify --frameworks ddp`)
    has the right fingerprint but allows only reject there: used as it is, the campaign would run
    without Rewind while saying "qualified"."""
    from ..envelope import FRAMEWORK_PROFILES, EnvelopeFileError, platform_fingerprint, read_envelope
    from ..envelope.file import check_fingerprint

    try:
        parsed = read_envelope(Path(path))
        check_fingerprint(parsed, platform_fingerprint("gloo", "cpu"))
    except EnvelopeFileError as exc:
        return str(exc)
    profile = FRAMEWORK_PROFILES[framework]
    rows = [row for row in parsed.rows if row.profile == profile]
    unprobed = sorted(row.phase for row in rows if "not_probed" in row.evidence)
    if not rows or unprobed:
        what = f"phases {', '.join(unprobed)}" if rows else "any phase"
        return (f"envelope {path} never probed {profile} ({what}): its rows there allow only reject; "
                f"`accelpact qualify --out {path}` probes every framework and phase")
    return None


def resolve_envelope(requested: str | None, out: Path, *, log: Callable[[str], None] = print,
                     run: Callable[[Sequence[str]], int] = subprocess.call) -> EnvelopePlan:
    """The plan for `requested`, with its qualification run and its file checked."""
    from ..envelope import default_envelope_path

    default_path = default_envelope_path()
    plan = plan_envelope(requested, default_path=default_path, default_problem=usable_envelope(default_path),
                         out=out)
    if plan.qualify_out is not None:
        plan.qualify_out.parent.mkdir(parents=True, exist_ok=True)
        argv = qualify_argv(plan.qualify_out)
        log(f"chaos: no usable envelope file; qualifying first (as a user would): {' '.join(argv[3:])}")
        code = run(argv)
        if code != 0:
            raise EnvelopeUnavailable(f"accelpact qualify exited {code}; no envelope written to {plan.qualify_out}")
    if plan.qualified:
        problem = usable_envelope(plan.envelope)
        if problem is not None:
            raise EnvelopeUnavailable(f"envelope {plan.envelope}: {problem}")
    return plan
