"""What spares cannot do, refused by name instead of hanging (issue 15).

A script that makes a group after `attach`: a spare's script would make it after joining, where
no survivor meets that `new_group`. Measured by hand before the check (a 4-rank FSDP2 job + a
spare whose script made one group after attach, `kill@3:forward:1`): the spare was claimed, hung in that
`new_group` until its timeout, and the job rejected only after a second membership change; with
the check every survivor rejects at once, naming the groups. Here, the check and its wiring into
a survivor's presence, in one process."""

from types import SimpleNamespace

import torch

from accelpact.comm import _c10d
from accelpact.config import Config
from accelpact.fsm.phases import FailurePhase
from accelpact.membership import world
from accelpact.runtime.member_change import presence_of
from accelpact.runtime.rewind import RewindState


def _survivor(recipe: world.WorldRecipe) -> SimpleNamespace:
    """The fields of a Runtime a survivor's presence reads, for a rank that can re-run."""
    rewind = RewindState(step_copy=False, max_rewinds=3)
    rewind.in_step = True
    return SimpleNamespace(
        rank=1, frontier=4, opt_step=4, update_index=5, generation=0, _recoveries=1, data_state=None, rewind=rewind,
        data_plane=SimpleNamespace(gids={}), envelope=SimpleNamespace(replace_phases=(FailurePhase.FORWARD,)),
        profile="fsdp2-hsdp", platform="cpu-gloo", envelope_source="test", recipe=recipe, neighbours=None,
        config=Config(), checkpointer=None, model=torch.nn.Linear(2, 2))


def test_a_survivor_that_lost_a_member_in_the_save_of_its_frontier_says_the_save_is_owed(monkeypatch):
    """`after_commit` marks the save of F interrupted; the presence carries it to the decision
    (`MembershipDecision.save_owed`). A mark of another frontier is stale: nothing is owed."""
    recipe = world.WorldRecipe(groups=(), control_name="3", count_after_attach=4)
    monkeypatch.setattr(_c10d, "group_count", lambda: 4)
    rt = _survivor(recipe)
    assert not presence_of(rt, FailurePhase.FORWARD)[0].save_interrupted  # no checkpointer at all
    rt.checkpointer = SimpleNamespace(interrupted_at=4)
    assert presence_of(rt, FailurePhase.COMMITTED)[0].save_interrupted
    rt.checkpointer.interrupted_at = 2
    assert not presence_of(rt, FailurePhase.COMMITTED)[0].save_interrupted


def test_a_group_made_after_attach_keeps_a_survivor_out_of_a_replace_with_the_reason(monkeypatch):
    recipe = world.WorldRecipe(groups=(), control_name="3", count_after_attach=4)
    monkeypatch.setattr(_c10d, "group_count", lambda: 4)
    assert world.groups_made_after_attach(recipe) == ""
    presence, _ = presence_of(_survivor(recipe), FailurePhase.FORWARD)
    assert presence.replace_ok and presence.replace_reason == ""

    monkeypatch.setattr(_c10d, "group_count", lambda: 6)  # the script made two more by new_group
    presence, _ = presence_of(_survivor(recipe), FailurePhase.FORWARD)
    assert not presence.replace_ok
    assert presence.replace_reason.startswith("the script made 2 group(s) by new_group or init_device_mesh after "
                                              "attach (c10d's counter reads 6, 4 right after attach)")
