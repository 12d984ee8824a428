"""The layout keeps the architecture: small functions where the protocol lives, a thin runtime
shell, and one place that ends the process."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "accelpact"

#: The test harness is not the library: a spawned test rank whose parent died ends itself.
HARNESS = {"accelpact/testing/spawn.py": "os._exit(",
           # the campaign's drill worker: a spare released by a rejected job exits as the job did
           "accelpact/testing/spare_drill.py": "os._exit(",
           # a spares job's worker forked from the preloaded forkserver ends as its interpreter would
           "accelpact/testing/spares.py": "os._exit("}


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("package", ["runtime", "fsm"])
def test_no_function_over_60_lines_where_the_protocol_lives(package):
    long = [f"{p.name}:{name} ({n} lines)" for p in sorted((PKG / package).glob("*.py"))
            for name, n in _functions(p) if n > 60]
    assert not long, long


def test_the_runtime_shell_stays_thin():
    assert len((PKG / "runtime" / "runtime.py").read_text().splitlines()) < 300


def test_only_the_edge_function_ends_the_process():
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for needle in re.findall(r"os\._exit\(|SIGTERM\)", code):  # exiting, or SIGTERM sent
                if rel == "accelpact/runtime/fail_stop.py" or HARNESS.get(rel) == needle:
                    continue
                hits.append(f"{rel}:{lineno}: {line.strip()}")
    assert not hits, hits


def test_drill_code_is_not_imported_by_the_production_runtime():
    """The runtime shell, its executor and handlers know nothing of faults (attach installs the
    injector from outside)."""
    for path in sorted((PKG / "runtime").glob("*.py")):
        if path.name == "attach.py":
            continue
        text = path.read_text()
        assert "..faults" not in text and "kill_self" not in text and "sleep(" not in text, path.name
