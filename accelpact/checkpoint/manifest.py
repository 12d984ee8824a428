"""The manifest: what a published step contains, and the pure rules that validate it.

The manifest is the only description of a step directory the loader trusts. It binds every file
(relative path, byte count, sha256) and the shape of the world that wrote it, so a loader can
refuse a torn, tampered or foreign checkpoint before unpickling a single byte. The COMMITTED
marker in turn binds the manifest by its own sha256, so a manifest replaced after publication is
detected too. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ManifestError

SCHEMA_VERSION = 1
COMMITTED_FORMAT = "accelpact-committed/1"

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")

Layout = str | Mapping[str, Any]


def normalize_layout(layout: Layout) -> str | dict[str, Any]:
    """Canonical, JSON-able form of a layout description (a string, or a JSON-able mapping)."""
    if isinstance(layout, str):
        if not layout.strip():
            raise ValueError("layout description must not be empty")
        return layout
    if isinstance(layout, Mapping):
        try:
            return json.loads(json.dumps(dict(layout), sort_keys=True))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"layout mapping must be JSON-serialisable: {exc}") from exc
    raise TypeError(f"layout must be a str or a mapping, got {type(layout).__name__}")


def layout_key(layout: Layout) -> str:
    """One string per layout, so two descriptions compare equal exactly when they are the same."""
    return json.dumps(normalize_layout(layout), sort_keys=True, separators=(",", ":"))


def describe_layout(world_size: int, layout: Layout) -> str:
    """Human-readable 'world_size=N layout=...' used in every layout error."""
    return f"world_size={world_size} layout={layout_key(layout)}"


@dataclass(frozen=True)
class FileEntry:
    """One file of a step directory, relative to it, with its size and content digest."""

    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """Everything a loader needs to decide whether a step directory may be trusted."""

    run_id: str
    attempt: str
    step: int
    world_size: int
    layout: str | dict[str, Any]
    torch_version: str
    files: tuple[FileEntry, ...]
    created_at: str
    frontier: int
    opt_step: int
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "step": self.step,
            "world_size": self.world_size,
            "layout": self.layout,
            "framework": {"name": "pytorch", "version": self.torch_version},
            "frontier": self.frontier,
            "opt_step": self.opt_step,
            "created_at": self.created_at,
            "total_bytes": self.total_bytes,
            "files": [f.to_dict() for f in self.files],
            "extra": self.extra,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"


def _need(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    if key not in doc:
        raise ManifestError(f"manifest field {key!r} is missing")
    value = doc[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ManifestError(f"manifest field {key!r} has type {type(value).__name__}, expected {kind.__name__}")
    return value


def _check_rel_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"manifest file path {path!r} is not a clean relative path")


def validate_files(entries: Any) -> tuple[FileEntry, ...]:
    """Parse and validate the file list: clean relative paths, unique, sizes >= 0, sha256 hex."""
    if not isinstance(entries, list) or not entries:
        raise ManifestError("manifest field 'files' must be a non-empty list")
    seen: set[str] = set()
    out: list[FileEntry] = []
    for i, raw in enumerate(entries):
        if not isinstance(raw, Mapping):
            raise ManifestError(f"manifest files[{i}] is not an object")
        path = _need(raw, "path", str)
        size = _need(raw, "bytes", int)
        digest = _need(raw, "sha256", str)
        _check_rel_path(path)
        if path in seen:
            raise ManifestError(f"manifest lists {path!r} twice")
        if size < 0:
            raise ManifestError(f"manifest files[{i}] ({path}) has negative size {size}")
        if not _SHA_RE.match(digest):
            raise ManifestError(f"manifest files[{i}] ({path}) sha256 {digest!r} is not 64 lowercase hex")
        seen.add(path)
        out.append(FileEntry(path, size, digest))
    return tuple(out)


def manifest_from_dict(doc: Any) -> Manifest:
    """Validate a decoded manifest document; raises ManifestError naming the first violation."""
    if not isinstance(doc, Mapping):
        raise ManifestError("manifest is not a JSON object")
    version = _need(doc, "schema_version", int)
    if version != SCHEMA_VERSION:
        raise ManifestError(f"manifest schema_version {version} is not supported (this build reads {SCHEMA_VERSION})")
    framework = _need(doc, "framework", Mapping)
    torch_version = _need(framework, "version", str)
    step = _need(doc, "step", int)
    world_size = _need(doc, "world_size", int)
    if step < 0:
        raise ManifestError(f"manifest step {step} is negative")
    if world_size < 1:
        raise ManifestError(f"manifest world_size {world_size} is < 1")
    layout = doc.get("layout")
    try:
        layout = normalize_layout(layout)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ManifestError(f"manifest layout is invalid: {exc}") from exc
    extra = doc.get("extra", {})
    if not isinstance(extra, Mapping):
        raise ManifestError("manifest field 'extra' must be an object")
    return Manifest(
        run_id=_need(doc, "run_id", str),
        attempt=_need(doc, "attempt", str),
        step=step,
        world_size=world_size,
        layout=layout,
        torch_version=torch_version,
        files=validate_files(doc.get("files")),
        created_at=_need(doc, "created_at", str),
        frontier=_need(doc, "frontier", int),
        opt_step=_need(doc, "opt_step", int),
        schema_version=version,
        extra=dict(extra),
    )


def parse_manifest(data: bytes | str) -> Manifest:
    """Decode and validate manifest bytes; a truncated or garbled file raises ManifestError."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"manifest is not valid JSON: {exc}") from exc
    return manifest_from_dict(doc)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _signature(key: bytes, step: int, digest: str) -> str:
    return hmac.new(key, f"accelpact-checkpoint\x1f{step}\x1f{digest}".encode(), hashlib.sha256).hexdigest()


def committed_marker(step: int, manifest_bytes: bytes, key: bytes | None = None) -> str:
    """Content of the COMMITTED marker: it names the step and pins the manifest's digest; with a
    signing key it also carries an HMAC of both, which only a holder of the key can recompute."""
    digest = sha256_bytes(manifest_bytes)
    doc: dict[str, object] = {"format": COMMITTED_FORMAT, "step": step, "manifest_sha256": digest}
    if key is not None:
        doc["hmac_sha256"] = _signature(key, step, digest)
    return json.dumps(doc, sort_keys=True) + "\n"


def check_committed(marker: bytes, step: int, manifest_bytes: bytes, key: bytes | None = None) -> str | None:
    """Why a COMMITTED marker does not vouch for this manifest, or None when it does. With a
    key, an unsigned or mis-signed marker never vouches (whoever can write the directory can
    recompute the digests, not the signature)."""
    try:
        doc = json.loads(marker.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "COMMITTED marker is not valid JSON"
    if not isinstance(doc, dict) or doc.get("format") != COMMITTED_FORMAT:
        return f"COMMITTED marker format is not {COMMITTED_FORMAT!r}"
    if doc.get("step") != step:
        return f"COMMITTED marker names step {doc.get('step')!r}, directory is step {step}"
    if doc.get("manifest_sha256") != sha256_bytes(manifest_bytes):
        return "manifest.json sha256 differs from the digest pinned in COMMITTED (manifest changed or torn)"
    if key is not None:
        mac = doc.get("hmac_sha256")
        if not isinstance(mac, str):
            return "COMMITTED is unsigned, and a checkpoint signing key is set (ACCELPACT_CHECKPOINT_KEY)"
        if not hmac.compare_digest(mac, _signature(key, step, str(doc["manifest_sha256"]))):
            return "COMMITTED signature does not verify under the checkpoint signing key (tampered, or another key)"
    return None


def layout_mismatch(manifest: Manifest, world_size: int, layout: Layout) -> str | None:
    """Why this checkpoint cannot be loaded into the current world, or None when shapes agree."""
    saved = describe_layout(manifest.world_size, manifest.layout)
    current = describe_layout(world_size, layout)
    if manifest.world_size != world_size or layout_key(manifest.layout) != layout_key(layout):
        return f"checkpoint step {manifest.step} was written by {saved}; this run is {current}"
    return None
