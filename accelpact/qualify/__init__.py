"""Qualification of the recovery envelope: `accelpact qualify` measures which recovery actions keep
training bitwise exact on this platform and writes them, with the evidence, to an envelope file
that the runtime loads (see `envelope_file` for the format, `probes` for the measurements)."""

from .envelope_file import (
    FORMAT,
    CorruptEnvelopeError,
    EnvelopeFile,
    EnvelopeFileError,
    MissingEnvelopeError,
    ProbeResult,
    QualifiedRow,
    StaleEnvelopeError,
    default_envelope_path,
    envelope_from_results,
    load_envelope,
    platform_fingerprint,
    platform_key,
    read_envelope,
    write_envelope,
)

__all__ = [
    "FORMAT",
    "CorruptEnvelopeError",
    "EnvelopeFile",
    "EnvelopeFileError",
    "MissingEnvelopeError",
    "ProbeResult",
    "QualifiedRow",
    "QualifyError",
    "QualifyResult",
    "StaleEnvelopeError",
    "default_envelope_path",
    "envelope_from_results",
    "load_envelope",
    "platform_fingerprint",
    "platform_key",
    "qualify",
    "read_envelope",
    "write_envelope",
]


def __getattr__(name: str):
    # The probes spawn torch worlds; load them on first use so that reading an envelope stays light.
    if name in ("qualify", "QualifyError", "QualifyResult"):
        from . import probes

        return getattr(probes, name)
    raise AttributeError(f"module 'accelpact.qualify' has no attribute {name!r}")
