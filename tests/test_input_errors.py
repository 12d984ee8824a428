"""Bad input is refused with a message that names what is wrong: the CLI says
`accelpact <cmd>: <message>` and exits 2 (no traceback), a library raises its own error type,
and nothing is silently ignored or defaulted. Every test here starts no process and no world."""

from __future__ import annotations

import math
import os
import re

import pytest

from accelpact import cli
from accelpact.config import MIN_TIMEOUT_S, Config
from accelpact.envelope import file as ef
from accelpact.errors import ConfigError

BAD_NUMBERS = (float("nan"), float("inf"), float("-inf"))


# ------------------------------------------------------------------------------ 1. envelope file


def test_an_envelope_file_that_is_not_utf8_is_corrupt_and_named(tmp_path):
    """A binary file is a corrupt envelope, not a UnicodeDecodeError from deep inside pathlib."""
    path = tmp_path / "envelope.json"
    path.write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(ef.CorruptEnvelopeError, match="not UTF-8") as info:
        ef.read_envelope(path)
    assert str(path) in str(info.value) and info.value.path == str(path)


def test_an_envelope_path_that_is_a_directory_is_refused_naming_it(tmp_path):
    """A directory given for the file says so (IsADirectoryError is no envelope error)."""
    with pytest.raises(ef.EnvelopeFileError, match="is a directory") as info:
        ef.read_envelope(tmp_path)
    assert str(tmp_path) in str(info.value) and info.value.path == str(tmp_path)
    assert not isinstance(info.value, ef.MissingEnvelopeError)  # never mistaken for "not qualified yet"


def test_an_unreadable_envelope_path_is_an_envelope_error(tmp_path):
    """A path under a file (NotADirectoryError) is an OSError like any other: named, not raised raw."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ef.EnvelopeFileError, match="cannot be read"):
        ef.read_envelope(tmp_path / "file" / "envelope.json")


# ------------------------------------------------------------------------------ 2. faults every attempt


def _injector(every: str | None, attempt: int = 1):
    from accelpact.faults.injector import FaultInjector

    env = {"ACCELPACT_FAULTS": "skip@8:committed:2"}
    if every is not None:
        env["ACCELPACT_FAULTS_EVERY_ATTEMPT"] = every
    return FaultInjector.from_env(rank=0, world_size=4, attempt=attempt, data_timeout_s=1.0, env=env)


@pytest.mark.parametrize("value", ["1", "true", "YES", " on ", "True"])
def test_every_attempt_takes_configs_true_values(value):
    assert _injector(value) is not None


@pytest.mark.parametrize("value", [None, "0", "false", "No", " off "])
def test_every_attempt_takes_configs_false_values(value):
    assert _injector(value) is None


@pytest.mark.parametrize("value", ["2", "ture", "", " ", "enabled"])
def test_every_attempt_refuses_what_config_would_refuse(value):
    """A typo used to mean "first attempt only", silently: a drill then tests less than it says."""
    with pytest.raises(ConfigError, match="ACCELPACT_FAULTS_EVERY_ATTEMPT"):
        _injector(value, attempt=0)


# ------------------------------------------------------------------------------ 3-5. accelpact demo


class _Launched:
    """Stands in for subprocess.Popen / subprocess.call: records each command, starts nothing."""

    def __init__(self):
        self.cmds: list[list[str]] = []
        self.envs: list[dict[str, str]] = []

    def popen(self, cmd, env=None, **_):
        self.cmds.append(list(cmd))
        self.envs.append(dict(env or {}))
        return self

    def call(self, cmd, env=None, **_):
        self.popen(cmd, env=env)
        return 0

    def wait(self):
        return 0


@pytest.fixture
def launched(monkeypatch):
    got = _Launched()
    monkeypatch.setattr(cli.subprocess, "Popen", got.popen)
    monkeypatch.setattr(cli.subprocess, "call", got.call)
    monkeypatch.setattr(cli, "_wait_for_port", lambda port, timeout_s=30.0: None)
    return got


def test_demo_with_spares_takes_none_for_no_faults(launched, tmp_path, capsys):
    """The help says 'none' means none; on the spares path it raised a parse error."""
    code = cli.main(["demo", "--spares", "1", "--faults", "none", "--trace-dir", str(tmp_path)])
    assert code == 1  # no result.json: nothing ran
    assert len(launched.cmds) == 5 and "--faults=none" in launched.cmds[0]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--spares", "1"], ["--on-loss", "shrink"], []])
def test_demo_refuses_a_malformed_fault_plan_before_launching(launched, tmp_path, capsys, extra):
    code = cli.main(["demo", *extra, "--faults", "kill@x:committed:1", "--trace-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and not launched.cmds
    assert err.startswith("accelpact demo: ") and "kill@x:committed:1" in err


def test_demo_with_spares_passes_no_rebind_on(launched, tmp_path):
    """--no-rebind is the causal ablation; dropping it on the spares path ran the un-ablated job."""
    cli.main(["demo", "--spares", "1", "--faults", "none", "--no-rebind", "--trace-dir", str(tmp_path)])
    assert all("--no-rebind" in cmd for cmd in launched.cmds)
    cli.main(["demo", "--on-loss", "shrink", "--faults", "none", "--trace-dir", str(tmp_path)])
    assert "--no-rebind" not in launched.cmds[-1]


@pytest.mark.parametrize("argv", [["--spares", "-1"], ["--nproc", "0"], ["--nproc", "-2"], ["--updates", "0"],
                                  ["--spares", "x"]])
def test_demo_refuses_counts_out_of_range(launched, capsys, argv):
    """--spares -1 used to start nproc - 1 agents; argparse now names the option."""
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", *argv])
    assert info.value.code == 2 and not launched.cmds
    assert f"argument {argv[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("faults", ["kill@12:committed:9", "skip@8:committed:4", "kill@3:forward:1,kill@3:forward:1"])
@pytest.mark.parametrize("extra", [["--spares", "2"], ["--on-loss", "shrink"], []])
def test_demo_refuses_a_fault_plan_that_does_not_fit_the_world(launched, tmp_path, capsys, faults, extra):
    """A rank outside the --nproc ranks was found only by the workers, after every agent started."""
    code = cli.main(["demo", *extra, "--faults", faults, "--trace-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and not launched.cmds and err.startswith("accelpact demo: ")


def test_demo_refuses_the_default_fault_plan_on_too_few_ranks(launched, tmp_path, capsys):
    """Without --faults the workers use their default plan, which names rank 2."""
    assert cli.main(["demo", "--nproc", "2", "--trace-dir", str(tmp_path)]) == 2
    assert not launched.cmds and "rank 2 is out of range" in capsys.readouterr().err


def test_demo_refuses_shrink_with_neighbour_replication_up_front(launched, tmp_path, capsys):
    """attach refuses the combination (a shrink does not rebuild the ring): say it before any agent starts."""
    code = cli.main(["demo", "--spares", "1", "--on-loss", "shrink", "--replicate", "neighbour", "--faults", "none",
                     "--trace-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and not launched.cmds
    assert err.startswith("accelpact demo: ") and "--on-loss shrink" in err and "--replicate" in err


def test_demo_errors_carry_the_command_prefix(launched, tmp_path, capsys):
    assert cli.main(["demo", "--replicate", "neighbour", "--trace-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("accelpact demo: ")
    assert cli.main(["demo", "--spares", "1", "--faults", "kill@5:committed:0", "--trace-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("accelpact demo: ")


# ------------------------------------------------------------------------------ 6. rendezvous endpoint


@pytest.mark.parametrize("value, want", [("node1", ("node1", 29400)), ("node1:1234", ("node1", 1234)),
                                         ("10.0.0.2:29500", ("10.0.0.2", 29500)), ("[::1]:5000", ("::1", 5000)),
                                         (" node1 ", ("node1", 29400)), ("", None)])
def test_rendezvous_endpoint_is_read_as_torchrun_reads_it(value, want):
    """torchrun takes a host alone (port 29400); `int('node1')` failed at the very end of the job."""
    from accelpact.launch_elastic import rendezvous_endpoint

    assert rendezvous_endpoint({"ACCELPACT_RDZV_ENDPOINT": value}) == want
    assert rendezvous_endpoint({}) is None


@pytest.mark.parametrize("value", ["node1:", "node1:port", "node1:70000", "node1:0", "no de:1", ":1234"])
def test_a_bad_rendezvous_endpoint_is_a_config_error_naming_it(value):
    from accelpact.launch_elastic import rendezvous_endpoint

    with pytest.raises(ConfigError, match="ACCELPACT_RDZV_ENDPOINT"):
        rendezvous_endpoint({"ACCELPACT_RDZV_ENDPOINT": value})


def _launch_env(monkeypatch, **extra: str) -> None:
    from torch.distributed import distributed_c10d as c10d

    # init_process_group may wrap c10d's group helper for the whole process: restore it afterwards
    monkeypatch.setattr(c10d, "_new_process_group_helper", c10d._new_process_group_helper)
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "4",
                       "TORCHELASTIC_RUN_ID": "t", "TORCHELASTIC_RESTART_COUNT": "0", **extra}.items():
        monkeypatch.setenv(key, value)


def _no_store(*args, **kwargs):
    raise AssertionError("a store was built before the environment was checked")


@pytest.mark.parametrize("watched", [{"ACCELPACT_SPARES": "1"}, {"ACCELPACT_ON_LOSS": "shrink"}])
def test_a_bad_rendezvous_endpoint_stops_the_launch_before_any_store(monkeypatch, watched):
    """Parsed where spares or shrink begin: a bad value no longer costs a 300 s exit barrier at the end."""
    import accelpact.launch as launch

    _launch_env(monkeypatch, ACCELPACT_RDZV_ENDPOINT="node1:port", **watched)
    monkeypatch.setattr(launch.dist, "TCPStore", _no_store)
    with pytest.raises(ConfigError, match="ACCELPACT_RDZV_ENDPOINT"):
        launch.init_process_group("gloo")


# ------------------------------------------------------------------------------ 7. goodput


@pytest.mark.parametrize("name", ["t0_s", "interruptions_per_day", "comm_failures_per_day", "committed_share", "age",
                                  "t_update_s", "t_repair_s", "c_reject_s", "guard_overhead", "n_eligible",
                                  "n_other"])
@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_goodput_params_refuse_non_finite_numbers_naming_the_field(name, bad):
    from accelpact.goodput import GoodputParams

    with pytest.raises(ValueError, match=name):
        GoodputParams(**{name: bad})


@pytest.mark.parametrize("argv", [["--t-update", "nan"], ["--t0", "inf"], ["--share", "nan"], ["--h", "nan"],
                                  ["--n-other", "inf"], ["--age=-inf"], ["--failures-per-day", "nan"]])
def test_goodput_cli_refuses_non_finite_numbers(capsys, argv):
    """`--t-update nan` printed a report of nan and exited 0."""
    assert cli.main(["goodput", "--paper-only", *argv]) == 2
    out = capsys.readouterr()
    assert "accelpact goodput: " in out.out + out.err and "nan s" not in out.out


def test_goodput_measured_rate_must_be_finite():
    from accelpact.goodput import GoodputParams, MeasuredEnvelope, MeasuredGuard, measured_params

    env = MeasuredEnvelope("c.json", {"preserve": 1, "rewind": 0, "replace": 0, "shrink": 0, "restarted": 1,
                                      "killed": 0}, "test")
    guard = MeasuredGuard("g.json", 0.001, 0.1, 4, "test")
    for bad in BAD_NUMBERS:
        with pytest.raises(ValueError, match="failures_per_day"):
            measured_params(GoodputParams(), env, guard, bad)
    assert math.isfinite(measured_params(GoodputParams(), env, guard, 1.0).n_eligible)


# ------------------------------------------------------------------------------ 8. accelpact report


def test_report_of_a_missing_directory_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert cli.main(["report", str(missing), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact report: ") and str(missing) in err and "Traceback" not in err


def test_report_of_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert cli.main(["report", str(tmp_path / "f"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact report: ") and str(tmp_path / "f") in err


@pytest.mark.parametrize("error", [ValueError("trace-rank0.jsonl: not UTF-8"), ConfigError("bad record"),
                                   IsADirectoryError(21, "Is a directory", "trace-rank0.jsonl")])
def test_report_errors_from_its_input_are_one_line_and_exit_2(monkeypatch, tmp_path, capsys, error):
    """Whatever the report refuses in its input (run_report's own messages) reaches the user as one line."""
    from accelpact import run_report

    def refuse(args):
        raise error

    monkeypatch.setattr(run_report, "run", refuse)
    assert cli.main(["report", str(tmp_path), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact report: ") and err.count("\n") == 1
    if isinstance(error, OSError):
        assert err == "accelpact report: trace-rank0.jsonl: Is a directory\n"


# ------------------------------------------------------------------------------ 9. accelpact qualify


@pytest.fixture
def no_probes(monkeypatch):
    """Any probe that starts fails the test: the checks must come first."""
    from accelpact.qualify import probes

    def started(*args, **kwargs):
        raise AssertionError("the probes started before the arguments were checked")

    monkeypatch.setattr(probes, "_sanity", started)
    monkeypatch.setattr(probes, "platform_fingerprint", started)
    return probes


def test_qualify_refuses_an_out_that_is_a_directory_before_probing(no_probes, tmp_path, capsys):
    assert cli.main(["qualify", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact qualify: ") and str(tmp_path) in err and "directory" in err


def test_qualify_refuses_an_out_under_a_file_before_probing(no_probes, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "envelope.json"
    assert cli.main(["qualify", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact qualify: ") and str(tmp_path / "file") in err


def test_qualify_refuses_an_out_it_cannot_write_before_probing(no_probes, tmp_path, monkeypatch, capsys):
    """Checked with os.access (the suite may run as root, for whom every directory is writable)."""
    real = os.access
    monkeypatch.setattr(no_probes.os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    assert cli.main(["qualify", "--quick", "--out", str(tmp_path / "new" / "envelope.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact qualify: ") and "not writable" in err and str(tmp_path) in err


def test_qualify_checks_out_without_creating_anything(no_probes, tmp_path):
    """A parent that does not exist yet is fine (write_envelope creates it) and is not created early."""
    no_probes._check_out(tmp_path / "a" / "b" / "envelope.json")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("value", ["0.005", "0", "-1", "nan"])
def test_qualify_data_timeout_has_configs_lower_bound(no_probes, tmp_path, capsys, value):
    """0.005 s passed `0 < x` although Config refuses data timeouts below MIN_TIMEOUT_S."""
    assert cli.main(["qualify", "--quick", "--out", str(tmp_path / "e.json"), "--data-timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact qualify: ") and "data_timeout_s" in err
    with pytest.raises(ConfigError):
        Config(data_timeout_s=float(value))


def test_qualify_data_timeout_at_the_bound_passes_the_checks():
    from accelpact.qualify import probes

    probes._check_arguments(("fsdp2",), ("committed",), 1, 4, MIN_TIMEOUT_S, 6.0)


# ------------------------------------------------------------------------------ 10. launch variables


def _launch_accepts(fn, env) -> bool:
    try:
        fn(env)
    except ConfigError:
        return False
    return True


def _config_accepts(env) -> bool:
    try:
        Config().with_env(env)
    except ConfigError:
        return False
    return True


BASE = {"MASTER_ADDR": "h", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "8"}


@pytest.mark.parametrize("value", ["reject", "shrink", " Shrink ", "SHRINK", "shrink ", "", "grow"])
def test_on_loss_is_read_exactly_as_config_reads_it(value):
    """' Shrink ' started the job watched, then every rank's attach refused it."""
    from accelpact.launch import _on_loss

    env = {**BASE, "ACCELPACT_ON_LOSS": value}
    assert _launch_accepts(_on_loss, env) == _config_accepts({"ACCELPACT_ON_LOSS": value})
    if not _config_accepts({"ACCELPACT_ON_LOSS": value}):
        with pytest.raises(ConfigError, match=re.escape(f"ACCELPACT_ON_LOSS={value!r}")):
            _on_loss(env)


@pytest.mark.parametrize("value", ["0", "2", " 2 ", "", "x", "-1", "1.5"])
def test_spares_is_read_exactly_as_config_reads_it(value):
    """An empty ACCELPACT_SPARES meant 0 spares here and an error at attach."""
    from accelpact.launch import _spares

    env = {**BASE, "ACCELPACT_SPARES": value}
    assert _launch_accepts(_spares, env) == _config_accepts({"ACCELPACT_SPARES": value})
    if not _config_accepts({"ACCELPACT_SPARES": value}):
        with pytest.raises(ConfigError, match="ACCELPACT_SPARES"):
            _spares(env)


def test_unset_launch_variables_keep_their_defaults():
    from accelpact.launch import _on_loss, _spares

    assert (_spares({}), _on_loss({})) == (0, "reject")


def test_goodput_cli_names_an_output_it_cannot_write(tmp_path, capsys):
    """--json into a missing directory was a traceback after the report."""
    out = tmp_path / "missing" / "g.json"
    assert cli.main(["goodput", "--paper-only", "--json", str(out)]) == 2
    assert f"accelpact goodput: cannot write {out}" in capsys.readouterr().out


def test_launch_arguments_agree_with_the_launcher_or_are_refused_by_name():
    """Found by review: under torchrun `rank=` raised a bare TypeError (passed twice), and under
    spares every other argument (`device_id=`) was dropped without a word."""
    from accelpact.launch import _take_launch_arguments

    same = {"rank": 2, "world_size": 4, "device_id": "cuda:2"}
    _take_launch_arguments(same, rank=2, world_size=4, watched=False)
    assert same == {"device_id": "cuda:2"}  # passed on to c10d
    with pytest.raises(ConfigError, match=r"init_process_group\(rank=...\) differs .*RANK=2"):
        _take_launch_arguments({"rank": 0}, rank=2, world_size=4, watched=False)
    with pytest.raises(ConfigError, match=r"init_process_group\(device_id=...\): under ACCELPACT_SPARES"):
        _take_launch_arguments({"device_id": "cuda:0", "world_size": 4}, rank=2, world_size=4, watched=True)


@pytest.mark.parametrize(("agent_store", "rank", "hosts"), [("True", 0, False), ("False", 0, True), (None, 0, True),
                                                             (None, 1, False)])
def test_the_store_is_hosted_where_torch_would_host_it(monkeypatch, agent_store, rank, hosts):
    """torchrun's agent hosts the store unless TORCHELASTIC_USE_AGENT_STORE says otherwise
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): then rank 0 does, as in torch's own rendezvous."""
    import accelpact.launch as launch

    _launch_env(monkeypatch, RANK=str(rank))
    if agent_store is None:
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent_store)
    seen = {}

    class Stop(Exception):
        pass

    def store(*args, is_master, **kwargs):
        seen["is_master"] = is_master
        raise Stop

    monkeypatch.setattr(launch.dist, "TCPStore", store)
    with pytest.raises(Stop):
        launch.init_process_group("gloo")
    assert seen["is_master"] is hosts


def _start(store, ranks, world_size, timeout_s=3.0) -> dict:
    """One attempt's workers `ranks` (of `world_size`) calling `agreed_attempt` at once, on threads."""
    import threading

    from accelpact.launch import agreed_attempt

    got: dict = {}

    def worker(rank):
        try:
            got[rank] = agreed_attempt(store, "accelpact/run/", rank, world_size, timeout_s)
        except ConfigError as exc:
            got[rank] = exc

    threads = [threading.Thread(target=worker, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_every_worker_of_an_attempt_agrees_on_its_number_though_one_died_before_it_counted():
    """Found by review: with attempt = (starts - 1) // world size, one worker that died before it
    added (W=4) gave the next attempts [0, 1, 1, 1] and [1, 2, 2, 2]: every start hung for good."""
    import torch.distributed as dist

    store = dist.HashStore()
    assert _start(store, range(4), 4) == {0: 0, 1: 0, 2: 0, 3: 0}
    died = _start(store, [0, 1, 2], 4, timeout_s=1.0)  # rank 3 died before it got here: rank 0 names it
    assert isinstance(died[0], ConfigError) and "rank 3 did not start attempt 1" in str(died[0])
    assert _start(store, range(4), 4) == {0: 2, 1: 2, 2: 2, 3: 2}
    # rank 0 died before it got here: the others are told so; no number is spent on that attempt
    orphans = _start(store, [1, 2, 3], 4, timeout_s=1.0)
    assert all(isinstance(v, ConfigError) and "rank 0 did not acknowledge" in str(v) for v in orphans.values())
    assert _start(store, range(4), 4) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert _start(store, range(6), 6) == dict.fromkeys(range(6), 4)  # a world that grew: no drift either


def test_a_number_left_by_a_rank_0_that_died_in_its_handshake_is_read_again_not_taken():
    import threading
    import time

    import torch.distributed as dist

    from accelpact.launch import agreed_attempt

    store = dist.HashStore()
    store.set("accelpact/run/current-attempt", "7")  # its rank 0 was killed before it withdrew it
    got: dict = {}
    followers = [threading.Thread(target=lambda r=r: got.setdefault(r, agreed_attempt(store, "accelpact/run/", r, 3,
                                                                                       8.0))) for r in (1, 2)]
    for t in followers:
        t.start()
    time.sleep(0.5)  # both read 7 and asked under it: nobody answers there
    assert store.check(["accelpact/run/attempt7/arrived/1", "accelpact/run/attempt7/arrived/2"])
    got[0] = agreed_attempt(store, "accelpact/run/", 0, 3, 8.0)
    for t in followers:
        t.join(10)
    assert got == {0: 0, 1: 0, 2: 0}


def test_a_worker_that_starts_before_rank_0_waits_for_its_number():
    import threading
    import time

    import torch.distributed as dist

    from accelpact.launch import agreed_attempt

    store = dist.HashStore()
    assert _start(store, range(2), 2) == {0: 0, 1: 0}
    got = {}
    follower = threading.Thread(target=lambda: got.setdefault(1, agreed_attempt(store, "accelpact/run/", 1, 2, 5.0)))
    follower.start()
    time.sleep(0.6)  # rank 1 has read attempt 0's number and asked under it: nobody answers there
    assert follower.is_alive()
    assert agreed_attempt(store, "accelpact/run/", 0, 2, 5.0) == 1
    follower.join(10)
    assert got == {1: 1}


@pytest.mark.parametrize(("argv", "said"), [
    (["--updates", "10"], "faults at update(s) [18, 28] come after the last update (--updates 10)"),
    (["--updates", "5", "--faults", "skip@8:committed:2"], "update(s) [8]"),
    (["--nproc", "6", "--faults", "none"], None),
    (["--nproc", "3", "--faults", "none"], "--nproc must be even"),
    (["--faults", "none", "--envelope", "{missing}"], "--envelope: "),
    (["--faults", "none", "--trace-dir", "{file}/x"], "--trace-dir="),
])
def test_demo_refuses_what_its_workers_would_trip_over_before_launching(launched, tmp_path, capsys, argv, said):
    """Found by review: faults past --updates never fired and the demo said PASS; an odd --nproc, a
    missing envelope and an unusable trace directory failed inside every worker, after the launch."""
    (tmp_path / "file").write_text("")
    argv = [a.format(missing=tmp_path / "none.json", file=tmp_path / "file") for a in argv]
    if "--trace-dir" not in argv:
        argv += ["--trace-dir", str(tmp_path / "trace")]
    code = cli.main(["demo", *argv])
    err = capsys.readouterr().err
    if said is None:  # an even --nproc goes through
        assert code != 2 and launched.cmds, err
        return
    assert code == 2 and not launched.cmds and err.startswith("accelpact demo: ") and said in err, err


def test_a_config_path_that_cannot_be_used_is_a_config_error_naming_the_setting(tmp_path):
    """Found by review: a trace_dir through a file died in the trace writer with NotADirectoryError;
    a fresh checkpoint_dir there was reported as a refused checkpoint; a metrics file there logged a
    traceback at every commit. attach checks them first (`accelpact.paths`)."""
    from accelpact.config import Config
    from accelpact.runtime.attach import _check_paths

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for setting in ("trace_dir", "checkpoint_dir"):
        with pytest.raises(ConfigError, match=f"{setting}=.*cannot be used as a directory: Not a directory"):
            _check_paths(Config(**{setting: str(blocker / "x")}), 0)
    with pytest.raises(ConfigError, match="the directory of metrics_textfile=.*cannot be used as a directory"):
        _check_paths(Config(metrics_textfile=str(blocker / "m.prom")), 0)
    _check_paths(Config(trace_dir=str(tmp_path / "t"), checkpoint_dir=str(tmp_path / "c"),
                        metrics_textfile=str(tmp_path / "m" / "x.prom")), 0)
    assert (tmp_path / "t").is_dir() and (tmp_path / "c").is_dir() and (tmp_path / "m").is_dir()
    # a directory or a {rank} template names one file per rank (`observe.metrics.textfile_path`)
    _check_paths(Config(metrics_textfile=str(tmp_path)), 3)
    _check_paths(Config(metrics_textfile=str(tmp_path / "r{rank}" / "m.prom")), 3)
    assert (tmp_path / "r3").is_dir()


def test_check_refuses_an_unwritable_json_path_before_running_tlc(tmp_path, capsys):
    """Found by review: the JSON was written only at the end, so a bad path failed after minutes of
    TLC, in a FileNotFoundError traceback."""
    (tmp_path / "f").write_text("")
    assert cli.main(["check", "--table", "--json", str(tmp_path / "f" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelpact check: ") and "--json=" in err and "Traceback" not in err


def test_report_draws_its_timeline_inside_a_directory_given_as_png(tmp_path, monkeypatch, capsys):
    """Found by review: `--png DIR` printed "timeline: DIR" while matplotlib wrote DIR.png beside it."""
    import argparse
    import json as json_

    from accelpact import run_report

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trace-rank0.jsonl").write_text(json_.dumps({"kind": "attach", "t": 1.0}) + "\n")
    drawn = []
    monkeypatch.setattr(run_report, "plot_timeline", lambda rows, summary, png, title: drawn.append(png))
    (tmp_path / "pics").mkdir()
    args = argparse.Namespace(run_dir=str(tmp_path / "run"), png=str(tmp_path / "pics"), no_plot=False,
                              json_out=None)
    assert run_report.run(args) == 0
    assert drawn == [str(tmp_path / "pics" / "timeline.png")]
    assert f"timeline: {tmp_path / 'pics' / 'timeline.png'}" in capsys.readouterr().out


def test_python_dash_m_accelpact_is_the_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "accelpact", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "qualify" in out.stdout


def test_an_empty_optional_number_in_the_environment_is_unset(monkeypatch):
    """Found by review: ACCELPACT_METRICS_PORT="" was "not an integer" where every other optional
    setting takes an empty value for unset; a bad number is still named."""
    from accelpact.config import Config

    monkeypatch.setenv("ACCELPACT_METRICS_PORT", "")
    assert Config().with_env().metrics_port is None
    monkeypatch.setenv("ACCELPACT_METRICS_PORT", "80x")
    with pytest.raises(ConfigError, match="ACCELPACT_METRICS_PORT='80x'"):
        Config().with_env()
