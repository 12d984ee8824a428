"""What spares cannot do, refused by name instead of hanging (issue 15)."""

import pytest

from accelpact.testing.drills import Drill
from accelpact.testing.spare_drill import drill_json
from accelpact.testing.spares import launch_with_spares

pytestmark = pytest.mark.timeout(200)


def test_a_group_made_after_attach_rejects_a_replacement_with_the_reason(tmp_path):
    """The script makes a group after attach. A spare's script would make it after joining,
    where no survivor meets that new_group (it would hang until its timeout), so the survivors
    reject the loss at once, naming the group count, and the spare is released with the job's
    code."""
    import sys

    drill = Drill(framework="fsdp2", updates=5, faults="kill@3:forward:1", rewind=True, envelope="permissive",
                  group_after_attach=True, data_timeout_s=1.0, control_timeout_s=6.0, reference=False)
    cmd = [sys.executable, "-m", "accelpact.testing.spare_drill", "--drill", drill_json(drill), "--out", str(tmp_path)]
    codes, output, seconds = launch_with_spares(cmd, active=4, spares=1, log_dir=tmp_path, timeout_s=150)
    explain = "\n".join(f"--- {r} exit {c}\n" + "\n".join(o.splitlines()[-8:]) for r, (c, o) in enumerate(zip(codes, output)))
    assert codes[1] == -9 and [codes[r] for r in (0, 2, 3, 4)] == [75, 75, 75, 75], explain
    assert "made 1 group(s) by new_group or init_device_mesh after attach" in "\n".join(output), explain
