"""Environment contract: names, defaults, parsing, durations, checkpoint directory names."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_runtime.contract import (
    ALL_ENV_VARS,
    ContractError,
    RuntimeSettings,
    checkpoint_dir_name,
    env,
    format_duration,
    parse_checkpoint_dir_name,
    parse_duration,
)

# The Environment table of DESIGN.md, verbatim names.
DESIGN_VARS = [
    "TRAINING_PROGRESS_FILE",
    "CHECKPOINT_ENABLED",
    "CHECKPOINT_URI",
    "CHECKPOINT_INTERVAL",
    "CHECKPOINT_STRATEGY",
    "CHECKPOINT_SAVE_STEPS",
    "CHECKPOINT_MAX_CHECKPOINTS",
    "CHECKPOINT_RESUME",
    "CHECKPOINT_JIT",
    "CHECKPOINT_LOCAL_DIR",
    "CHECKPOINT_LOCAL_PERIOD",
    "CHECKPOINT_CONTROL_DIR",
    "PROGRESS_UPDATE_FREQUENCY",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "KUBECKPT_JOB_KIND",
    "KUBECKPT_JOB_NAME",
    "KUBECKPT_NAMESPACE",
]

ENABLED = {"CHECKPOINT_ENABLED": "true", "CHECKPOINT_URI": "/mnt/kubeckpt/team-a/job-x"}


def test_every_design_variable_has_a_constant_named_after_it() -> None:
    assert list(ALL_ENV_VARS) == DESIGN_VARS
    for name in DESIGN_VARS:
        assert getattr(env, name) == name


def test_well_known_names() -> None:
    assert env.RUN_DIR == "/var/run/kubeckpt"
    assert env.REQUEST_FILE == "checkpoint-request"
    assert (env.DONE_FILE, env.FAILED_FILE) == ("checkpoint-done", "checkpoint-failed")
    assert env.INCOMPLETE_SENTINEL == "checkpoint-is-incomplete.txt"
    assert env.MANIFEST_FILE == "manifest.json"


def test_defaults_when_nothing_is_set() -> None:
    s = RuntimeSettings.from_env({})
    assert s.progress_file == "/workspace/training_progress.json"
    assert s.checkpoint_enabled is False
    assert s.checkpoint_uri is None
    assert s.checkpoint_interval == 300.0
    assert s.checkpoint_strategy == "time"
    assert s.checkpoint_save_steps is None
    assert s.max_checkpoints == 3
    assert s.resume is True
    assert s.jit is True
    assert s.local_dir is None
    assert s.local_period == 100
    assert s.control_dir == "/var/run/kubeckpt"
    assert s.progress_update_frequency == 5
    assert s.elastic_shutdown_timeout is None
    assert (s.job_kind, s.job_name, s.namespace) == (None, None, None)
    assert s == RuntimeSettings()


def test_empty_values_mean_unset() -> None:
    s = RuntimeSettings.from_env({name: "" for name in DESIGN_VARS} | {"CHECKPOINT_JIT": "  "})
    assert s == RuntimeSettings()


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DESIGN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CHECKPOINT_MAX_CHECKPOINTS", "7")
    monkeypatch.setenv("TRAINING_PROGRESS_FILE", "/var/run/kubeckpt/progress.json")
    s = RuntimeSettings.from_env()
    assert s.max_checkpoints == 7
    assert s.progress_file == "/var/run/kubeckpt/progress.json"


def full_env() -> dict[str, str]:
    return {
        "TRAINING_PROGRESS_FILE": "/var/run/kubeckpt/progress.json",
        "CHECKPOINT_ENABLED": "TRUE",
        "CHECKPOINT_URI": "s3://b/p/job-x",
        "CHECKPOINT_INTERVAL": "1h30m",
        "CHECKPOINT_STRATEGY": "Steps",
        "CHECKPOINT_SAVE_STEPS": "500",
        "CHECKPOINT_MAX_CHECKPOINTS": "5",
        "CHECKPOINT_RESUME": "no",
        "CHECKPOINT_JIT": "0",
        "CHECKPOINT_LOCAL_DIR": "/var/run/kubeckpt/local",
        "CHECKPOINT_LOCAL_PERIOD": "50",
        "CHECKPOINT_CONTROL_DIR": "/tmp/ctl",
        "PROGRESS_UPDATE_FREQUENCY": "10",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "240",
        "KUBECKPT_JOB_KIND": "PyTorchJob",
        "KUBECKPT_JOB_NAME": "job-x",
        "KUBECKPT_NAMESPACE": "team-a",
    }


def test_every_variable_is_parsed() -> None:
    s = RuntimeSettings.from_env(full_env())
    assert s == RuntimeSettings(
        progress_file="/var/run/kubeckpt/progress.json",
        checkpoint_enabled=True,
        checkpoint_uri="s3://b/p/job-x",
        checkpoint_interval=5400.0,
        checkpoint_strategy="steps",
        checkpoint_save_steps=500,
        max_checkpoints=5,
        resume=False,
        jit=False,
        local_dir="/var/run/kubeckpt/local",
        local_period=50,
        control_dir="/tmp/ctl",
        progress_update_frequency=10,
        elastic_shutdown_timeout=240,
        job_kind="PyTorchJob",
        job_name="job-x",
        namespace="team-a",
    )
    assert s.request_file == Path("/tmp/ctl/checkpoint-request")
    assert s.done_file == Path("/tmp/ctl/checkpoint-done")
    assert s.failed_file == Path("/tmp/ctl/checkpoint-failed")


@pytest.mark.parametrize(
    "settings",
    [
        RuntimeSettings(),
        RuntimeSettings.from_env(full_env()),
        RuntimeSettings(checkpoint_interval=2.5, elastic_shutdown_timeout=0),
        RuntimeSettings(checkpoint_interval=0.1),
    ],
)
def test_to_env_round_trips(settings: RuntimeSettings) -> None:
    out = settings.to_env()
    assert all(isinstance(v, str) for v in out.values())
    assert RuntimeSettings.from_env(out) == settings


def test_to_env_writes_interval_as_plain_seconds() -> None:
    out = RuntimeSettings.from_env({"CHECKPOINT_INTERVAL": "5m"}).to_env()
    assert out["CHECKPOINT_INTERVAL"] == "300"
    assert out["CHECKPOINT_ENABLED"] == "false"
    assert "CHECKPOINT_URI" not in out  # unset stays unset


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("Yes", True),
        ("1", True),
        (" true ", True),
        ("false", False),
        ("False", False),
        ("NO", False),
        ("0", False),
    ],
)
def test_bool_spellings(text: str, expected: bool) -> None:
    assert RuntimeSettings.from_env({"CHECKPOINT_RESUME": text}).resume is expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CHECKPOINT_ENABLED", "maybe"),
        ("CHECKPOINT_ENABLED", "2"),
        ("CHECKPOINT_RESUME", "tru"),
        ("CHECKPOINT_JIT", "on"),
        ("CHECKPOINT_SAVE_STEPS", "abc"),
        ("CHECKPOINT_SAVE_STEPS", "0"),
        ("CHECKPOINT_SAVE_STEPS", "1.5"),
        ("CHECKPOINT_MAX_CHECKPOINTS", "0"),
        ("CHECKPOINT_MAX_CHECKPOINTS", "-3"),
        ("CHECKPOINT_MAX_CHECKPOINTS", "+3"),
        ("CHECKPOINT_MAX_CHECKPOINTS", "1_000"),
        ("CHECKPOINT_MAX_CHECKPOINTS", "99999999999999999999"),
        ("CHECKPOINT_LOCAL_PERIOD", "0"),
        ("CHECKPOINT_LOCAL_PERIOD", "ten"),
        ("PROGRESS_UPDATE_FREQUENCY", "0"),
        ("PROGRESS_UPDATE_FREQUENCY", "5s"),
        ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-1"),
        ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30s"),
        ("CHECKPOINT_STRATEGY", "hourly"),
        ("CHECKPOINT_INTERVAL", "0"),
        ("CHECKPOINT_INTERVAL", "0s"),
        ("CHECKPOINT_INTERVAL", "-5m"),
        ("CHECKPOINT_INTERVAL", "5 minutes"),
        ("CHECKPOINT_INTERVAL", "abc"),
        ("CHECKPOINT_INTERVAL", "1e999"),
        ("CHECKPOINT_INTERVAL", "5d"),
        ("CHECKPOINT_URI", "pvc://claim/path"),
        ("CHECKPOINT_URI", "://nohost"),
    ],
)
def test_bad_values_are_rejected_naming_variable_and_value(name: str, value: str) -> None:
    with pytest.raises(ContractError) as exc:
        RuntimeSettings.from_env({name: value})
    message = str(exc.value)
    assert message.startswith(f"{name}:")
    assert value in message
    assert exc.value.field == name
    assert isinstance(exc.value, ValueError)


def test_shutdown_timeout_zero_is_allowed() -> None:
    # torchrun reads the variable with int() and accepts 0.
    assert (
        RuntimeSettings.from_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0"}).elastic_shutdown_timeout
        == 0
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300.0),
        ("2.5", 2.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("1500ms", 1.5),
    ],
)
def test_interval_accepts_seconds_and_go_durations(text: str, seconds: float) -> None:
    assert RuntimeSettings.from_env({"CHECKPOINT_INTERVAL": text}).checkpoint_interval == seconds


def test_enabled_requires_uri() -> None:
    with pytest.raises(ContractError, match=r"^CHECKPOINT_URI: required"):
        RuntimeSettings.from_env({"CHECKPOINT_ENABLED": "true"})
    # Disabled pods must start whatever else is missing.
    assert RuntimeSettings.from_env({"CHECKPOINT_ENABLED": "false"}).checkpoint_uri is None


def test_steps_strategy_requires_save_steps_when_enabled() -> None:
    with pytest.raises(ContractError, match=r"^CHECKPOINT_SAVE_STEPS: required"):
        RuntimeSettings.from_env(ENABLED | {"CHECKPOINT_STRATEGY": "steps"})
    s = RuntimeSettings.from_env(
        ENABLED | {"CHECKPOINT_STRATEGY": "steps", "CHECKPOINT_SAVE_STEPS": "9"}
    )
    assert (s.checkpoint_strategy, s.checkpoint_save_steps) == ("steps", 9)


@pytest.mark.parametrize(
    "uri", ["/mnt/kubeckpt/a/b", "s3://bucket/prefix/job", "file:///data/ckpt"]
)
def test_accepted_uris(uri: str) -> None:
    assert RuntimeSettings.from_env(ENABLED | {"CHECKPOINT_URI": uri}).checkpoint_uri == uri


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ContractError, match="CHECKPOINT_MAX_CHECKPOINTS"):
        RuntimeSettings(max_checkpoints=0)
    with pytest.raises(ContractError, match="CHECKPOINT_LOCAL_PERIOD"):
        RuntimeSettings(local_period=True)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="CHECKPOINT_ENABLED"):
        RuntimeSettings(checkpoint_enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="CHECKPOINT_INTERVAL"):
        RuntimeSettings(checkpoint_interval=float("nan"))


# --- Go durations ---


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h2m3.5s", 3723.5),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("+2m", 120.0),
        ("-1m30s", -90.0),
        ("1m1m", 120.0),
        ("1500us", 0.0015),
        ("3\u00b5s", 3e-6),
        ("2ns", 2e-9),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text",
    ["", "5", "1.5", "m", ".s", "1x", "1h 30m", " 5m", "5m ", "1H", "1d", "--5m", "1h-2m", "s5"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ContractError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.25, "250ms"), (1.5, "1.5s"), (60, "1m"), (2700, "45m"), (3723.5, "1h2m3.5s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_format_duration_rejects_negative_and_nan() -> None:
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ContractError):
            format_duration(bad)


# --- checkpoint directory names ---


def test_checkpoint_dir_names() -> None:
    assert checkpoint_dir_name(150) == "checkpoint-150"
    assert checkpoint_dir_name(0) == "checkpoint-0"
    assert parse_checkpoint_dir_name("checkpoint-150") == 150
    assert parse_checkpoint_dir_name("checkpoint-0") == 0
    for step in (0, 7, 10**12):
        assert parse_checkpoint_dir_name(checkpoint_dir_name(step)) == step


@pytest.mark.parametrize(
    "name",
    [
        "checkpoint-",
        "checkpoint-01",
        "checkpoint--1",
        "checkpoint-1a",
        "checkpoint-5.tmp",
        "checkpoint-\u0661",  # an Arabic-Indic digit: str.isdigit() would accept it
        "Checkpoint-5",
        "ckpt-5",
        "checkpoint-5/",
        "manifest.json",
    ],
)
def test_parse_checkpoint_dir_name_rejects(name: str) -> None:
    assert parse_checkpoint_dir_name(name) is None


@pytest.mark.parametrize("step", [-1, True, 1.0, "5"])
def test_checkpoint_dir_name_rejects(step: object) -> None:
    with pytest.raises(ContractError, match="step"):
        checkpoint_dir_name(step)  # type: ignore[arg-type]


def test_generation_dir_names() -> None:
    assert env.generation_dir_name(1) == "generation-1"
    assert env.parse_generation_dir_name("generation-12") == 12
    assert env.checkpoint_rel_path(150) == "checkpoint-150"
    assert env.checkpoint_rel_path(150, 2) == "generation-2/checkpoint-150"
    for generation in (1, 9, 10**12):
        assert env.parse_generation_dir_name(env.generation_dir_name(generation)) == generation


@pytest.mark.parametrize(
    "name",
    [
        "generation-0",  # generation 0 is the root itself
        "generation-01",
        "generation--1",
        "generation-",
        "generation-1 ",
        "generation-\u0661",
        "Generation-1",
        "checkpoint-1",
        "generation-1" + "0" * 19,  # beyond int64
    ],
)
def test_parse_generation_dir_name_rejects(name: str) -> None:
    assert env.parse_generation_dir_name(name) is None


@pytest.mark.parametrize("generation", [0, -1, True, 1.0, "1"])
def test_generation_dir_name_rejects(generation: object) -> None:
    with pytest.raises(ContractError, match="generation"):
        env.generation_dir_name(generation)  # type: ignore[arg-type]
