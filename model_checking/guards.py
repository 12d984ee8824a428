"""The spec's guards, generated from the Python transition table.

Comparing edges proves the spec and `accelpact/fsm/table.py` move between the same phases, not
that they move under the same conditions: a guard dropped from the table left the edges equal.
So the table's sources, destination, conditions and `unless` entries are written out as the TLA+
module `spec/AccelPactTable.tla`, which the spec EXTENDS: every rank action is enabled exactly
when `TableAllows(trigger, ...)` holds, with each predicate name interpreted in the spec's terms
(`Holds` in AccelPact.tla). The shipped module must equal what this renders from the table now
(`accelpact check --conformance` and tests/test_conformance.py), so a table edit is either
regenerated, and then model checked, or reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TABLE_MODULE = "AccelPactTable"


def _str(s: str) -> str:
    return '"' + s + '"'


def _set(xs: Sequence[str]) -> str:
    return "{" + ", ".join(_str(x) for x in xs) + "}"


def _case(name: str, rows: Sequence[tuple[str, str]]) -> str:
    body = "\n".join(f"    [] t = {_str(t)} -> {v}" for t, v in rows)
    return f"{name}(t) == CASE\n       {body[7:]}"


def render_table_module(rows: Sequence | None = None) -> str:
    """The TLA+ module of the table's guards (`rows`: the table's Row objects; default the real one)."""
    if rows is None:
        from accelpact.fsm.table import TRANSITIONS as rows
    triggers = list(dict.fromkeys(r.trigger for r in rows))
    by: dict[str, list] = {t: [r for r in rows if r.trigger == t] for t in triggers}
    for t, rs in by.items():
        if len(rs) != 1:
            raise ValueError(f"trigger {t!r} has {len(rs)} rows: the generated guards need one row per trigger")
    lines = [
        f"---------------------------- MODULE {TABLE_MODULE} ----------------------------",
        "(* GENERATED from accelpact/fsm/table.py by model_checking/guards.py -- do not edit;     *)",
        "(* regenerate with `accelpact check --write-table`.  Each trigger's source phases,      *)",
        "(* destination, conditions (all must hold) and unless entries (none may hold).           *)",
        "",
        "TableTriggers == " + _set(triggers),
        _case("Sources", [(t, _set([str(s) for s in by[t][0].source])) for t in triggers]),
        _case("Dest", [(t, _str(str(by[t][0].dest))) for t in triggers]),
        _case("Conditions", [(t, _set(list(by[t][0].conditions))) for t in triggers]),
        _case("Unless", [(t, _set(list(by[t][0].unless))) for t in triggers]),
        "",
        "(* Whether trigger t may fire from phase ph, predicate names read through P. *)",
        "TableAllows(t, ph, P(_)) ==",
        "    /\\ ph \\in Sources(t)",
        "    /\\ \\A c \\in Conditions(t) : P(c)",
        "    /\\ \\A u \\in Unless(t) : ~P(u)",
        "=============================================================================",
    ]
    return "\n".join(lines) + "\n"


def table_module_path(spec_dir: Path) -> Path:
    return Path(spec_dir) / f"{TABLE_MODULE}.tla"


def table_module_is_current(spec_dir: Path) -> tuple[bool, str]:
    """Whether the shipped guards equal the table's; the message names the triggers that differ."""
    path = table_module_path(spec_dir)
    want = render_table_module()
    have = path.read_text() if path.is_file() else ""
    if have == want:
        return True, f"{path.name} == accelpact/fsm/table.py"
    changed = [ln for ln in want.splitlines() if ln not in have.splitlines()]
    return False, (f"{path.name} differs from accelpact/fsm/table.py (regenerate with `accelpact check "
                   f"--write-table`, then model check): " + "; ".join(ln.strip() for ln in changed[:6]))


def write_table_module(spec_dir: Path) -> Path:
    path = table_module_path(spec_dir)
    path.write_text(render_table_module())
    return path
