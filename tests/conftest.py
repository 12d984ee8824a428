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

import pytest

os.environ["ACCELPACT_ENVELOPE_DIR"] = tempfile.mkdtemp(prefix="accelpact-test-envelope-")


@pytest.fixture(scope="module")
def fake_world():
    """A 4-rank world of torch's fake backend in this process (no peers, no collectives run): for
    modules whose tests build groups and wrappers to rebind. Used by `pytestmark`."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.fail("a default process group is already initialised in this pytest process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield
    dist.destroy_process_group()
