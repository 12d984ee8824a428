"""Which recovery envelope a runtime obeys: the qualified file `accelpact qualify` wrote for this
platform, or the built-in one (Preserve at committed boundaries only) when there is none.

An explicitly configured file must exist and match the platform: a job that asked for qualified
actions must not quietly run without them. The default location is only a convenience, so a
missing or stale file there falls back to the built-in envelope with a message saying how to
qualify.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from .file import (
    EnvelopeFileError,
    MissingEnvelopeError,
    StaleEnvelopeError,
    default_envelope_path,
    load_envelope,
    platform_fingerprint,
)
from .model import DEFAULT_ENVELOPE, Envelope, permissive_envelope

log = logging.getLogger("accelpact.runtime")

_BACKEND_DEVICE = {"cpu-gloo": ("gloo", "cpu"), "cuda-nccl": ("nccl", "cuda")}
_warned: set[str] = set()  # say it once per process, not at every attach


def conditions_met(config: Config) -> tuple[str, ...]:
    """The envelope conditions (`model.CONDITIONS`) a run under `config` meets: an action a row
    qualified only under others is withheld from it (`fsm.decisions.envelope_facts`)."""
    return ("step_copy",) if config.step_copy else ()


def choose_envelope(config: Config, platform: str, profile: str, *, rank: int = 0) -> tuple[Envelope, str]:
    """(envelope, where it came from) for `config.envelope`."""
    choice = config.envelope
    if choice == "builtin":
        return DEFAULT_ENVELOPE, "built-in"
    if choice == "permissive":
        return permissive_envelope(platform, profile), "permissive (qualification run)"

    backend, device = _BACKEND_DEVICE.get(platform, (platform, "unknown"))
    expect = platform_fingerprint(backend, device)
    if choice is not None:
        try:
            return load_envelope(Path(choice), expect=expect), str(choice)
        except EnvelopeFileError as exc:
            raise ConfigError(f"Config.envelope: {exc}") from None
    path = default_envelope_path()
    try:
        return load_envelope(path, expect=expect), str(path)
    except (MissingEnvelopeError, StaleEnvelopeError) as exc:
        if rank == 0 and str(path) not in _warned:
            _warned.add(str(path))
            log.warning("%s -- until then the built-in envelope applies: Preserve at committed boundaries, "
                        "no Rewind", exc)
        return DEFAULT_ENVELOPE, f"built-in ({type(exc).__name__})"
    except EnvelopeFileError as exc:
        raise ConfigError(f"default envelope {path}: {exc}") from None
