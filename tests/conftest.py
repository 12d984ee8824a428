"""Test-suite wide settings.

The runtime picks up a qualified envelope from ~/.cache/accelpact when one exists (`accelpact
qualify` writes it). The suite must not depend on whether the machine running it was qualified,
so it points the default location at an empty directory: every test gets the built-in envelope
unless it names one (tests that need Rewind pass `envelope=` explicitly). Set before any world is
spawned, so child processes inherit it.
"""

from __future__ import annotations

import os
import tempfile

os.environ["ACCELPACT_ENVELOPE_DIR"] = tempfile.mkdtemp(prefix="accelpact-test-envelope-")
