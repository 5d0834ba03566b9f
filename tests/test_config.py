"""Config validation and domain planning (record 002): errors name the domain or key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulayer_tui.engine.config import (
    ConfigError,
    load_config,
    parse_config,
    parse_config_text,
    plan_domains,
)
from gpulayer_tui.engine.gpus import GIB, GpuReading
from gpulayer_tui.engine.paths import resolve_paths
from gpulayer_tui.engine.simulate import SimulatedProbe, parse_simulate_spec

from .conftest import EngineFactory


def gpus(n: int) -> tuple[GpuReading, ...]:
    return tuple(
        GpuReading(index=i, uuid=f"GPU-{i}", name="X", memory_total=80 * GIB, memory_used=0)
        for i in range(n)
    )


def test_default_is_one_domain_per_gpu_plus_cpu_pool() -> None:
    plans = plan_domains(parse_config({}), gpus(2), cpu_count=8)
    assert [(p.name, p.gpu_index, p.slots) for p in plans] == [
        ("gpu0", 0, 1),
        ("gpu1", 1, 1),
        ("cpu", None, 8),
    ]


def test_named_domains_by_index_and_uuid() -> None:
    config = parse_config(
        {
            "cpu": {"slots": 3},
            "domains": {"train": {"gpu": 1, "slots": 2}, "infer": {"gpu": "GPU-0"}},
        }
    )
    plans = plan_domains(config, gpus(3), cpu_count=8)
    assert [(p.name, p.gpu_index, p.slots) for p in plans] == [
        ("infer", 0, 1),
        ("train", 1, 2),
        ("gpu2", 2, 1),
        ("cpu", None, 3),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"domains": {"a": {"gpu": 0}, "b": {"gpu": 0}}},
            "domains.a and domains.b both claim GPU 0",
        ),
        (
            {"domains": {"a": {"gpu": 0}, "b": {"gpu": "GPU-0"}}},
            "domains.a and domains.b both claim GPU 0",
        ),
        (
            {"domains": {"big": {"gpu": 5}}},
            "domains.big: gpu 5 does not exist (the GPUs seen: GPU 0, GPU 1)",
        ),
        ({"domains": {"x": {"gpu": "GPU-nope"}}}, "domains.x: gpu 'GPU-nope' does not exist"),
        ({"domains": {"gpu1": {"gpu": 0}}}, "'gpu1' is also the automatic name of GPU 1"),
    ],
)
def test_bindings_rejected(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_domains(parse_config(data), gpus(2), cpu_count=2)


@pytest.mark.parametrize("gpu", [5, -1, "GPU-nope"])
def test_a_domain_named_like_an_automatic_one_is_told_its_own_gpu_is_missing(
    gpu: int | str,
) -> None:
    # As the engine plans (a missing GPU left out to wait): gpu0 = 5 was told to rename
    # itself, as if its name were the problem.
    shown = f"gpu {gpu}" if isinstance(gpu, int) else f"gpu {gpu!r}"
    with pytest.raises(ConfigError) as caught:
        plan_domains(parse_config({"domains": {"gpu0": {"gpu": gpu}}}), gpus(2), 2, missing={})
    said = str(caught.value)
    assert f"domains.gpu0: {shown} does not exist (the GPUs seen: GPU 0, GPU 1)" in said
    assert "rename it" not in said


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"domains": {"a": {"gpu": 0, "slots": 0}}}, "domains.a.slots: must be at least 1, got 0"),
        ({"domains": {"a": {"gpu": 0, "slot": 2}}}, "unknown key 'domains.a.slot'"),
        # A union's members were said one by one, in the library's words ("gpu.int: Input
        # should be a valid integer", "gpu.str: ...").
        (
            {"domains": {"a": {"gpu": 0.5}}},
            "domains.a.gpu: expected an integer or a string, got 0.5$",
        ),
        (
            {"domains": {"a": {"gpu": True}}},
            "domains.a.gpu: expected an integer or a string, got true$",
        ),
        (
            {"security": {"allowed_groups": [1.5]}},
            "security.allowed_groups.0: expected an integer or a string, got 1.5$",
        ),
        (
            {"security": {"allowed_uids": ["bob"]}},
            'allowed_uids.0: must be a whole number, got "bob"$',
        ),
        ({"domain": {}}, r"unknown key 'domain' \(did you mean 'domains'\?\)$"),
        # A near miss is named, as the CLI names a flag's (tester h182 #6).
        (
            {"engine": {"sample_intervall": 1.0}},
            r"unknown key 'engine.sample_intervall' \(did you mean 'engine.sample_interval'\?\)$",
        ),
        (
            {"users": {"root": {"max_gpuss": 1}}},
            r"'users.root.max_gpuss' \(did you mean 'users.root.max_gpus'\?\)$",
        ),
        ({"engine": {"zzzz": 1}}, r"unknown key 'engine.zzzz'$"),
        # (a key of another table: named with it; tester h187)
        ({"sample_interval": 1.0}, r"'sample_interval' \(did you mean 'engine.sample_interval'"),
        ({"slots": 2}, r"'slots' \(did you mean 'cpu.slots'\?\)$"),  # (not 'logs')
        # Keys that are not bare are quoted as TOML writes them (an empty one is "").
        ({"": 1}, "unknown key '\"\"'"),
        ({"engine": {"": 1}}, "unknown key 'engine.\"\"'"),
        ({"engine": {"a b": 1}}, "unknown key 'engine.\"a b\"'"),
        ({"engine": {"é": 1}}, "unknown key 'engine.\"é\"'"),
        ({"engine": {"sample_interval": "1"}}, "engine.sample_interval"),
        ({"cpu": {"slots": 0}}, "cpu.slots"),
        ({"domains": {"cpu": {"gpu": 0}}}, "'cpu' is the CPU pool's name"),
        ({"domains": {"CPU": {"gpu": 0}}}, "domains.CPU: too like 'cpu', the CPU pool's name"),
        ({"domains": {"9bad": {"gpu": 0}}}, "domains.9bad: a domain name is a letter"),
        # "^...$" took a name ending in a newline (only as $'x\n' could one name it)
        ({"domains": {"x\n": {"gpu": 0}}}, "a domain name is a letter"),
        ({"clusters": {"x\n": {"partition": "gpu"}}}, "a cluster name is a letter"),
        (
            {"clusters": {"a b;$(x)": {"partition": "gpu"}}},
            r'clusters\."a b;\$\(x\)": a cluster name is a letter',
        ),
        # Every timing has a floor: these would spin a core for ever.
        (
            {"engine": {"sample_interval": 1e-9}},
            "engine.sample_interval: must be at least 0.05, got",
        ),
        ({"engine": {"probe_timeout": 1e-9}}, "engine.probe_timeout: must be at least 0.05, got"),
        ({"services": {"steady_after": 1e-9}}, "services.steady_after: must be at least 0.1, got"),
        # Not a number at all: said so (a bound's message before).
        (
            {"engine": {"sample_interval": float("nan")}},
            "sample_interval: must be a finite number, got NaN",
        ),
        (
            {"engine": {"probe_timeout": float("inf")}},
            "probe_timeout: must be a finite number, got Inf",
        ),
    ],
)
def test_schema_rejected(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "config.toml")


def test_the_checkpoint_signal_is_turned_off_with_an_empty_string(tmp_path: Path) -> None:
    # TOML has no null: a job that cannot save (and dies of SIGUSR1) had no way out.
    file = tmp_path / "config.toml"
    file.write_text('[scheduling]\npreempt_after = 60\ncheckpoint_signal = ""\n')
    assert load_config(file).scheduling.checkpoint_signal is None
    file.write_text('[scheduling]\ncheckpoint_signal = "SIGUSR2"\n')
    assert load_config(file).scheduling.checkpoint_signal == "SIGUSR2"
    # (without its SIG, as `signal --signal` takes it: "USR2" was refused, tester h154)
    file.write_text('[scheduling]\ncheckpoint_signal = "USR2"\n')
    assert load_config(file).scheduling.checkpoint_signal == "SIGUSR2"
    file.write_text('[scheduling]\ncheckpoint_signal = "USR"\n')
    with pytest.raises(ConfigError, match="checkpoint_signal: 'USR' is not a signal name"):
        load_config(file)
    # One that cannot warn: SIGSTOP froze the job through its SIGTERM (tester h59).
    for name, why in [("SIGSTOP", "stops the job"), ("SIGKILL", "kills the job at once")]:
        file.write_text(f'[scheduling]\ncheckpoint_signal = "{name}"\n')
        with pytest.raises(ConfigError, match=f"checkpoint_signal.*{name} {why}"):
            load_config(file)


def test_no_gpus_visible_names_that(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gpu 0 does not exist \\(no GPUs are visible\\)"):
        plan_domains(parse_config({"domains": {"a": {"gpu": 0}}}), (), cpu_count=1)


def test_load_config_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert load_config(path) == parse_config({})  # missing file: defaults
    path.write_text("[domains.a\n")
    with pytest.raises(ConfigError, match=f"{path}: not valid TOML"):
        load_config(path)
    path.write_text("[domains.a]\ngpu = 0\nslots = 2\nbogus = 1\n")
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'domains.a.bogus'"):
        load_config(path)
    # Messages that name the problem (tester h193): a key given twice names its line, a
    # byte that is not UTF-8 its line and column, a missing key and a short list in words;
    # a byte order mark (Notepad's) is read past.
    path.write_text("[cpu]\nslots = 2\nslots = 3\n")
    with pytest.raises(
        ConfigError, match="a key or table is given twice, the second time here: slots = 3"
    ):
        load_config(path)
    path.write_bytes(b"[cpu]\nslots = 2\n# caf\xe9\n")
    with pytest.raises(
        ConfigError, match=r"not UTF-8 text: invalid continuation byte \(at line 3, column 6\)"
    ):
        load_config(path)
    path.write_bytes("[cpu]\nslots = 2\n# été".encode() + b"\xff\n")  # (in characters)
    with pytest.raises(ConfigError, match=r"invalid start byte \(at line 3, column 6\)"):
        load_config(path)
    path.write_text("[domains.a]\nslots = 2\n")
    with pytest.raises(ConfigError, match=r"domains\.a\.gpu: needed, and not given$"):
        load_config(path)
    path.write_text("[notify]\ncommand = []\n")
    with pytest.raises(ConfigError, match=r"notify\.command: must have at least 1 item, got \[\]$"):
        load_config(path)
    path.write_bytes("\ufeff[cpu]\nslots = 3\n".encode())
    assert load_config(path).cpu.slots == 3
    # A FIFO would block the read (and the engine's start) for ever: refused at once.
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ConfigError, match=f"{path}: not a regular file"):
        load_config(path)


def test_paths_follow_gpulayer_home_then_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "h"))
    paths = resolve_paths()
    assert paths.state_dir == tmp_path / "h"
    assert paths.config_file == tmp_path / "h" / "config.toml"
    monkeypatch.delenv("GPULAYER_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    paths = resolve_paths()
    assert paths.state_dir == tmp_path / "state" / "gpulayer"
    assert paths.config_file == tmp_path / "cfg" / "gpulayer" / "config.toml"
    assert resolve_paths(tmp_path / "other.toml").config_file == tmp_path / "other.toml"
    # A relative XDG directory is ignored, as the XDG spec (and systemd) say.
    monkeypatch.setenv("XDG_STATE_HOME", "rel/state")
    monkeypatch.setenv("XDG_CONFIG_HOME", "rel/cfg")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    paths = resolve_paths()
    assert paths.state_dir == tmp_path / "home" / ".local" / "state" / "gpulayer"
    assert paths.config_file == tmp_path / "home" / ".config" / "gpulayer" / "config.toml"


async def test_engine_refuses_config_that_does_not_match_the_machine(
    make_engine: EngineFactory,
) -> None:
    config = parse_config({"domains": {"a": {"gpu": 0}, "b": {"gpu": 0}}})
    with pytest.raises(ConfigError, match="both claim GPU 0"):
        await make_engine("2xA100-80GB", config=config)
    # the failed start released the lock: a good config starts on the same dir
    engine = await make_engine("2xA100-80GB")
    assert [d.name for d in engine.scheduler.domains.values()] == ["gpu0", "gpu1", "cpu"]


@pytest.mark.parametrize("bad", ["", "2A100-80GB", "2xA100", "0xA100-80GB", "2xA100-80GB,"])
def test_a_bad_simulate_spec_is_refused_naming_the_option(bad: str) -> None:
    with pytest.raises(ValueError, match="--simulate"):
        parse_simulate_spec(bad)


def test_simulate_spec_parsing(tmp_path: Path) -> None:
    parsed = parse_simulate_spec("1xH200-141GB,2xL4-24GB")
    assert [(g.model, g.memory_gib) for g in parsed] == [
        ("H200", 141.0),
        ("L4", 24.0),
        ("L4", 24.0),
    ]
    probe = SimulatedProbe(parsed, tmp_path)
    result = probe.read()
    assert [g.memory_total for g in result.gpus] == [141 * GIB, 24 * GIB, 24 * GIB]
    assert len({g.uuid for g in result.gpus}) == 3
    assert SimulatedProbe(parsed, tmp_path).read().gpus[0].uuid == result.gpus[0].uuid


def test_health_thresholds_out_of_order_are_refused() -> None:
    # A GPU was quarantined before it could ever show "degraded".
    with pytest.raises(ConfigError) as err:
        parse_config_text("[health]\ndegrade_after = 10\nquarantine_after = 2\n", "c.toml")
    assert "health: degrade_after (10) is more than quarantine_after (2)" in str(err.value)
    assert "Value error" not in str(err.value)
    parse_config_text("[health]\ndegrade_after = 3\nquarantine_after = 3\n", "c.toml")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        # (pydantic's words named a class: "a valid dictionary or instance of UserLimits")
        (
            {"users": {"max_gpus": 1}},
            "config: users.max_gpus: expected a table ([users.NAME]), got 1",
        ),
        ({"engine": 3}, "config: engine: expected a table ([engine]), got 3"),
        # (a too-short string, where it is not a signal name at all)
        ({"scheduling": {"checkpoint_signal": "9"}}, "'9' is not a signal name (e.g. SIGUSR1)"),
        (
            {"users": {"default": {"max_vram_gb": 0.0001}}},
            "users.default.max_vram_gb: 0.0001 GiB is less than the least VRAM a job may declare",
        ),
        ({"users": {"ana": {"share": 1e-320}}}, "users.ana.share: "),
    ],
)
def test_config_errors_say_what_is_wrong_in_the_files_words(
    data: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert says in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("host", "taken"),
    [("999.1.1.1", False), ("10.0.0.256", False), ("1.2.3", False), ("10.0.0.5", True),
     ("gpu-box.lan", True), ("::1", True), ("node7", True)],
)  # fmt: skip
def test_a_services_host_that_looks_like_an_address_must_be_one(host: str, taken: bool) -> None:
    # (all digits is no host name: "999.1.1.1" was taken as valid: tester h193)
    if taken:
        assert parse_config({"services": {"host": host}}).services.host == host
        return
    with pytest.raises(ConfigError, match=r"is not an IP address \(four parts from 0 to 255\)"):
        parse_config({"services": {"host": host}})
