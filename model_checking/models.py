"""Where the spec and its models live, and what each model is expected to do.

The shipped models are plain files under spec/ so that anyone can run them with TLC by hand:
`spec/MC{2,3,4}.cfg` (the protocol, must pass), `spec/mutants/*.cfg` (deliberately broken
variants, each must violate the property its `\\* expect:` header names) and
`spec/witnesses/*.cfg` (interesting states, each must be reached: its invariant violated). This module only finds
them and judges a TLC result against that expectation.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from .tlc import DEFAULT_JAVA_OPTS, ModelConfig, Status, TlcResult, run_tlc, run_tlc_many, without_properties

REPO_ROOT = Path(__file__).resolve().parent.parent
RANK_COUNTS: tuple[int, ...] = (2, 3, 4)
SPEC_FILE = "AccelPact.tla"


def spec_dir(override: Path | str | None = None) -> Path:
    """spec/ of this checkout, or `override`, or $ACCELPACT_SPEC_DIR."""
    if override is not None:
        return Path(override)
    env = os.environ.get("ACCELPACT_SPEC_DIR")
    return Path(env) if env else REPO_ROOT / "spec"


def spec_path(directory: Path | None = None) -> Path:
    path = spec_dir(directory) / SPEC_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no TLA+ spec at {path}")
    return path


def rank_model(ranks: int, directory: Path | None = None) -> ModelConfig:
    path = spec_dir(directory) / f"MC{ranks}.cfg"
    if not path.is_file():
        raise FileNotFoundError(f"no model for {ranks} ranks at {path} (shipped: {RANK_COUNTS})")
    return ModelConfig.load(path)


def mutant_models(directory: Path | None = None) -> list[ModelConfig]:
    models = [ModelConfig.load(p) for p in sorted((spec_dir(directory) / "mutants").glob("*.cfg"))]
    for m in models:
        if m.expect == "pass":
            raise ValueError(f"mutant {m.path} expects to pass: every mutant must name the property it breaks")
    return models


def witness_models(directory: Path | None = None) -> list[ModelConfig]:
    """spec/witnesses/*.cfg: each names an "interesting state" invariant TLC must violate."""
    models = [ModelConfig.load(p) for p in sorted((spec_dir(directory) / "witnesses").glob("*.cfg"))]
    for m in models:
        if m.expect not in m.invariants:
            raise ValueError(f"witness {m.path} must check the invariant it expects to be violated")
    return models


#: Possibility properties: "some state satisfies P" cannot be an invariant, so it is checked as the
#: negated witness invariant on the right, which TLC must violate (spec/witnesses/). A mutant
#: caught by a possibility is one under which TLC finds no such state: its run passes.
POSSIBILITIES = {"ResumePossible": "NoResumeEver"}


def expectation_met(model: ModelConfig, result: TlcResult) -> bool:
    """A correct model must pass; a mutant must be caught by exactly the property it names
    (for a possibility: its witness is never violated, every other property holds)."""
    if model.expect == "pass":
        return result.status is Status.PASS
    if model.expect in POSSIBILITIES:
        return POSSIBILITIES[model.expect] in model.invariants and result.status is Status.PASS
    return result.status in (Status.INVARIANT, Status.LIVENESS) and result.violated == model.expect


def cfg_for_run(model: ModelConfig) -> Path | str:
    """What TLC is given for `model`: its file, or, for a model that must violate an invariant,
    its text without the temporal properties. TLC stops at the first invariant violation and
    checks liveness (`-lncheck final`) only after a complete search, so the properties decide
    nothing there; yet with them TLC builds the behaviour graph as it explores, which made such
    runs 3x slower (proof_by_epoch: 10.7 s, 3.0 s without, the same 9,254 states). Should the
    mutant not be caught, the run passes instead of reporting a liveness verdict: a failure
    either way."""
    if model.properties and model.expect in model.invariants:
        return without_properties(model.path.read_text())
    return model.path


def check_model(model: ModelConfig, *, workers: int = 1, timeout_s: float = 600.0,
                directory: Path | None = None, java_opts: Sequence[str] = DEFAULT_JAVA_OPTS) -> TlcResult:
    module = spec_module(model)
    spec = spec_path(directory) if module == SPEC_FILE else spec_dir(directory) / module
    if not spec.is_file():
        raise FileNotFoundError(f"no TLA+ spec at {spec} (named by {model.path})")
    return run_tlc(spec, cfg_for_run(model), workers=workers, timeout_s=timeout_s,
                   check_deadlock=model.check_deadlock, java_opts=java_opts)


# -- the membership change (rank replacement with hot spares, issue 15) ---------------------------
#: spec/Membership.tla is checked with its own models under spec/membership/: MC<W>.cfg (W active
#: positions; must pass), mutants/*.cfg and witnesses/*.cfg (as above). A cfg names the module it
#: checks with a `\* spec: Membership.tla` header; without one it checks SPEC_FILE.
MEMBERSHIP_DIR = "membership"
MEMBERSHIP_SIZES: tuple[int, ...] = (3, 4)
MEMBERSHIP_DEFAULT: tuple[int, ...] = (3,)  # the one the default check (and CI) runs
#: further models that `--membership W` checks after MC<W>: the shrink (Config.on_loss="shrink").
MEMBERSHIP_EXTRA: dict[int, tuple[str, ...]] = {4: ("MC4shrink", "MC4shrink_losses", "MC4shrink_spare")}


def spec_module(model: ModelConfig) -> str:
    """The .tla file a model checks: its `\\* spec:` header, else SPEC_FILE."""
    for raw in model.path.read_text().splitlines() if model.path.is_file() else ():
        line = raw.strip()
        if line.startswith("\\*"):
            key, _, value = line[2:].partition(":")
            if key.strip() == "spec" and value.strip():
                return value.strip()
    return SPEC_FILE


def membership_dir(directory: Path | None = None) -> Path:
    return spec_dir(directory) / MEMBERSHIP_DIR


def membership_model(positions: int, directory: Path | None = None) -> ModelConfig:
    path = membership_dir(directory) / f"MC{positions}.cfg"
    if not path.is_file():
        raise FileNotFoundError(f"no membership model for {positions} positions at {path} "
                                f"(shipped: {MEMBERSHIP_SIZES})")
    return ModelConfig.load(path)


def membership_extra(positions: int, directory: Path | None = None) -> list[ModelConfig]:
    """The models `--membership positions` checks after MC<positions> (MEMBERSHIP_EXTRA)."""
    return [ModelConfig.load(membership_dir(directory) / f"{name}.cfg") for name in MEMBERSHIP_EXTRA.get(positions, ())]


def membership_mutants(directory: Path | None = None) -> list[ModelConfig]:
    found = [ModelConfig.load(p) for p in sorted((membership_dir(directory) / "mutants").glob("*.cfg"))]
    for m in found:
        if m.expect == "pass":
            raise ValueError(f"mutant {m.path} expects to pass: every mutant must name the property it breaks")
    return found


def membership_witnesses(directory: Path | None = None) -> list[ModelConfig]:
    found = [ModelConfig.load(p) for p in sorted((membership_dir(directory) / "witnesses").glob("*.cfg"))]
    for m in found:
        if m.expect not in m.invariants:
            raise ValueError(f"witness {m.path} must check the invariant it expects to be violated")
    return found


def plan_jobs(n_models: int, *, workers: int, jobs: int | None = None) -> tuple[int, int]:
    """(runs at a time, workers of each run) for `n_models` runs within `workers` threads."""
    jobs = min(workers, n_models) if jobs is None else jobs
    jobs = max(1, min(jobs, n_models, workers))
    return jobs, max(1, workers // jobs)


def check_models(models: Sequence[ModelConfig], *, workers: int = 1, jobs: int | None = None,
                 timeout_s: float = 600.0, directory: Path | None = None,
                 java_opts: Sequence[str] = DEFAULT_JAVA_OPTS) -> Iterator[TlcResult]:
    """`check_model` of each model, several at a time within `workers` threads in all; results in
    the order given. `jobs` runs at a time (default: one per worker, each run with one worker, as
    many as there are models); the workers are divided among them. `java_opts`: the whole protocol
    models want `tlc.LONG_RUN_JAVA_OPTS`."""
    jobs, per_run = plan_jobs(len(models), workers=workers, jobs=jobs)
    runs = [functools.partial(run_tlc, spec_dir(directory) / spec_module(m), cfg_for_run(m), workers=per_run,
                              timeout_s=timeout_s, check_deadlock=m.check_deadlock, java_opts=java_opts)
            for m in models]
    return run_tlc_many(runs, jobs=jobs)
