"""Qualification of the recovery envelope: `accelpact qualify` measures which recovery actions keep
training bitwise exact on this platform and writes them, with the evidence, to an envelope file
that the runtime loads (`accelpact.envelope.file` for the format, `probes` for the measurements)."""

__all__ = ["QualifyError", "QualifyResult", "qualify"]


def __getattr__(name: str):
    # The probes spawn torch worlds; load them on first use.
    if name in ("qualify", "QualifyError", "QualifyResult"):
        from . import probes

        return getattr(probes, name)
    raise AttributeError(f"module 'accelpact.qualify' has no attribute {name!r}")
