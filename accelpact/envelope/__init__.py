"""The recovery envelope: which recovery actions are qualified for an observation key.

- `model`: the pure table (ObservationKey -> qualified actions, with evidence) and the built-in one;
- `file`: the envelope file `accelpact qualify` writes and the runtime reads (format, platform
  fingerprint, missing/stale/corrupt errors);
- `choice`: which envelope a runtime obeys (`Config.envelope`).

Importing this package does not import torch (only fingerprinting the running platform does).
"""

from .choice import choose_envelope, conditions_met
from .file import (
    EXPECTED_ACTION,
    FORMAT,
    FRAMEWORK_PROFILES,
    REBUILD_PROBE,
    CorruptEnvelopeError,
    EnvelopeFile,
    EnvelopeFileError,
    MissingEnvelopeError,
    ProbeResult,
    QualifiedRow,
    StaleEnvelopeError,
    compact_evidence,
    default_envelope_path,
    envelope_from_results,
    load_envelope,
    platform_fingerprint,
    platform_key,
    read_envelope,
    write_envelope,
)
from .model import (
    DEFAULT_ENVELOPE,
    OBJECTIVE_BITWISE,
    PROFILES,
    Envelope,
    EnvelopeRow,
    ObservationKey,
    UnknownObservationKey,
    permissive_envelope,
)

__all__ = [
    "DEFAULT_ENVELOPE",
    "EXPECTED_ACTION",
    "FORMAT",
    "FRAMEWORK_PROFILES",
    "OBJECTIVE_BITWISE",
    "PROFILES",
    "REBUILD_PROBE",
    "CorruptEnvelopeError",
    "Envelope",
    "EnvelopeFile",
    "EnvelopeFileError",
    "EnvelopeRow",
    "MissingEnvelopeError",
    "ObservationKey",
    "ProbeResult",
    "QualifiedRow",
    "StaleEnvelopeError",
    "UnknownObservationKey",
    "choose_envelope",
    "conditions_met",
    "compact_evidence",
    "default_envelope_path",
    "envelope_from_results",
    "load_envelope",
    "permissive_envelope",
    "platform_fingerprint",
    "platform_key",
    "read_envelope",
    "write_envelope",
]
