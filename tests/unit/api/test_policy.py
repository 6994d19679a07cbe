"""CheckpointPolicy and override parsing, field by field: the CRD's defaults, what each validator
accepts and refuses, the one-line messages, and the cache by uid and resourceVersion."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeckpt_api.policy import OVERRIDES, Policy, apply_overrides, policy_from_object
from trainer_runtime.contract import ContractError

CRD = Path(__file__).parents[3] / "config/crd/bases/kubeckpt.io_checkpointpolicies.yaml"


def obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"storage": {"uri": "pvc://ckpt/runs"}}
    base.update(spec)
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": base,
    }


def error(o: Any) -> ContractError:
    with pytest.raises(ContractError) as info:
        policy_from_object(o)
    message = str(info.value)
    assert "\n" not in message and len(message) <= 400
    return info.value


def _with_crd_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server stores: `value` with the schema's defaults filled in, recursively."""
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    out = dict(value)
    for name, sub in (schema.get("properties") or {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = _with_crd_defaults(sub, out[name])
    return out


def test_defaults_are_the_crds() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    minimal = obj()
    defaulted = obj(**_with_crd_defaults(spec_schema, minimal["spec"]))
    assert defaulted["spec"]["interval"] == "5m" and defaulted["spec"]["jit"]["enabled"] is True
    assert policy_from_object(minimal) == policy_from_object(defaulted)
    p = policy_from_object(minimal)
    assert (p.interval_seconds, p.strategy, p.max_checkpoints, p.resume) == (300, "time", 3, True)
    assert (p.jit, p.max_grace_seconds, p.local_enabled) == (True, 300, False)
    assert (p.local_period_steps, p.progress_every_steps, p.auto_instrumentation) == (100, 5, False)
    assert p.mount_path == "/mnt/kubeckpt"
    assert (p.name, p.namespace, p.created) == ("p", "ns", "2026-01-01T00:00:00Z")


def test_a_full_policy() -> None:
    p = policy_from_object(
        obj(
            storage={"uri": "s3://b/p", "mountPath": "/data/", "secretRef": {"name": "creds"}},
            selector={"matchLabels": {"team": "nlp"}, "unknown": 1},
            interval="1h30m",
            strategy="steps",
            saveSteps=50,
            maxCheckpoints=7,
            resume=False,
            jit={"enabled": False, "maxGracePeriodSeconds": 900},
            localTier={
                "enabled": True,
                "sizeLimit": "64Gi",
                "modelParameters": 7,
                "periodSteps": 3,
            },
            progress={"updateEverySteps": 2},
            instrumentation={"auto": True},
            futureField={"x": 1},  # ignored, as the API server would have pruned it
        )
    )
    assert p == Policy(
        name="p",
        namespace="ns",
        storage_uri="s3://b/p",
        mount_path="/data",
        secret_name="creds",
        interval_seconds=5400,
        strategy="steps",
        save_steps=50,
        max_checkpoints=7,
        resume=False,
        jit=False,
        max_grace_seconds=900,
        local_enabled=True,
        local_size_limit="64Gi",
        local_model_parameters=7,
        local_period_steps=3,
        progress_every_steps=2,
        auto_instrumentation=True,
        selector={"matchLabels": {"team": "nlp"}},
        created="2026-01-01T00:00:00Z",
    )


def test_null_is_an_absent_field_as_the_api_server_prunes_it() -> None:
    p = policy_from_object(obj(interval=None, jit=None, localTier={"sizeLimit": None}))
    assert (p.interval_seconds, p.jit, p.local_size_limit) == (300, True, None)
    assert str(error(obj(storage={"uri": None}))) == "spec.storage.uri is required"


@pytest.mark.parametrize(
    ("o", "message"),
    [
        ({}, "spec is required"),
        ({"spec": 5}, "spec: expected an object, got 5"),
        ({"spec": {}}, "spec.storage is required"),
        (obj(storage={}), "spec.storage.uri is required"),
        (obj(storage={"uri": ""}), "spec.storage.uri is required"),
        (obj(storage={"uri": 5}), "spec.storage.uri: expected a string, got 5"),
        (obj(storage={"uri": "s3://b", "mountPath": 7}), "spec.storage.mountPath: expected a path"),
        (obj(jit="yes"), "spec.jit: expected an object, got 'yes'"),
        (obj(jit=[1]), "spec.jit: expected an object, got a list"),
        ({"metadata": {"name": ["x"]}, "spec": {"storage": {"uri": "s"}}}, "metadata.name: "),
        (obj(strategy="hourly"), "spec.strategy: expected one of time, steps, epoch"),
        (obj(strategy=1), "spec.strategy: expected one of time, steps, epoch"),
        (
            obj(selector={"matchExpressions": [{"key": "a", "operator": "Is"}]}),
            "spec.selector.matchExpressions[0].operator: expected 'In', 'NotIn', 'Exists' or",
        ),
        (obj(selector={"matchLabels": {"a\nb": 1}}), "spec.selector.matchLabels['a\\nb']: "),
    ],
)
def test_shape_errors_name_the_field(o: Any, message: str) -> None:
    assert str(error(o)).startswith(message)


def test_not_an_object_at_all() -> None:
    assert str(error(["spec"])) == "CheckpointPolicy: expected an object"


@pytest.mark.parametrize(
    ("interval", "seconds"),
    [("5m", 300), ("90s", 90), ("1h30m", 5400), ("1.5s", 2), ("1500ms", 2), ("600", 600)],
)
def test_interval(interval: str, seconds: int) -> None:
    assert policy_from_object(obj(interval=interval)).interval_seconds == seconds


@pytest.mark.parametrize(
    ("interval", "why"),
    [
        ("0s", "must be at least 1s, got '0s'"),
        ("500ms", "must be at least 1s"),
        ("-5m", "must be at least 1s"),
        ("0", "must be at least 1s"),
        ("x", "invalid duration 'x'"),
        ("\u0661\u0662", "invalid duration"),  # other scripts' digits are not seconds
        ("9" * 400, "must be at most 9223372036s"),  # was an OverflowError
        ("300000000h", "must be at most"),  # past Go's longest duration
        (300, "expected a duration string such as 5m, got 300"),
    ],
)
def test_bad_interval(interval: Any, why: str) -> None:
    e = error(obj(interval=interval))
    assert e.field == "spec.interval" and str(e).startswith(f"spec.interval: {why}")


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("maxCheckpoints", 1, True),
        ("maxCheckpoints", "4", True),  # the hand-written parser took int("4"), so do we
        ("maxCheckpoints", 0, False),
        ("maxCheckpoints", -1, False),
        ("maxCheckpoints", True, False),
        ("maxCheckpoints", 1.5, False),
        ("maxCheckpoints", 2**63, False),
        ("saveSteps", 0, False),
        ("saveSteps", "²", False),
    ],
)
def test_positive_integers(field: str, value: Any, ok: bool) -> None:
    if ok:
        policy_from_object(obj(**{field: value}))
    else:
        assert str(error(obj(**{field: value}))) == f"spec.{field}: expected a positive integer"


def test_nested_positive_integers() -> None:
    for o, path in [
        (obj(localTier={"periodSteps": 0}), "spec.localTier.periodSteps"),
        (obj(localTier={"modelParameters": -3}), "spec.localTier.modelParameters"),
        (obj(progress={"updateEverySteps": "x"}), "spec.progress.updateEverySteps"),
    ]:
        assert str(error(o)) == f"{path}: expected a positive integer"


@pytest.mark.parametrize(("grace", "ok"), [(30, True), (86400, True), (29, False), (86401, False)])
def test_grace_bounds(grace: int, ok: bool) -> None:
    o = obj(jit={"maxGracePeriodSeconds": grace})
    if ok:
        assert policy_from_object(o).max_grace_seconds == grace
    else:
        assert str(error(o)) == "spec.jit.maxGracePeriodSeconds: expected 30..86400"


def test_booleans_are_booleans() -> None:
    # bool("false") is True: the hand-written parser turned this into resume=True
    assert policy_from_object(obj(resume="false")).resume is False
    assert str(error(obj(resume=0))) == "spec.resume: expected true or false"
    assert str(error(obj(jit={"enabled": []}))) == "spec.jit.enabled: expected true or false"


@pytest.mark.parametrize(
    ("size", "stored"), [("64Gi", "64Gi"), (" 8Gi ", "8Gi"), (1024, "1024"), ("1e9", "1e9")]
)
def test_size_limit(size: Any, stored: str) -> None:
    assert policy_from_object(obj(localTier={"sizeLimit": size})).local_size_limit == stored


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("size", "why"),
    [
        ("0", "must be positive"),
        (-1, "must be positive"),
        ("1Gb", "not a quantity"),
        ("NaN", "not a quantity"),  # Decimal parses it; comparing it raised InvalidOperation
        ("Infinity", "not a quantity"),  # ceil() raised OverflowError
        ("1e999999999", "too large"),  # ceil() built a billion-digit int: admission hung
        ("1e999999999Ei", "not a quantity"),  # exponent and suffix: not a form the CRD allows
        (True, "not a quantity"),
        ({"a": 1}, "not a quantity: an object"),
    ],
)
def test_bad_size_limit(size: Any, why: str) -> None:
    assert str(error(obj(localTier={"sizeLimit": size}))).startswith(
        f"spec.localTier.sizeLimit: {why}"
    )


def test_several_errors_report_the_first_and_a_count() -> None:
    e = error(obj(strategy="x", maxCheckpoints=0, jit={"enabled": "x"}))
    assert str(e) == "spec.strategy: expected one of time, steps, epoch (and 2 more)"


def test_selector_is_kept_as_written_and_validated() -> None:
    sel = {"matchExpressions": [{"key": "team", "operator": "Exists"}]}
    assert policy_from_object(obj(selector=sel)).selector == sel
    assert policy_from_object(obj()).selector == {}


# --- the cache ---


def _versioned(version: str, **spec: Any) -> dict[str, Any]:
    o = obj(**spec)
    o["metadata"].update(uid="u-1", resourceVersion=version)
    return o


def test_cached_by_uid_and_resource_version() -> None:
    first = policy_from_object(_versioned("1", maxCheckpoints=4))
    assert policy_from_object(_versioned("1", maxCheckpoints=4)) is first
    assert policy_from_object(_versioned("2", maxCheckpoints=5)).max_checkpoints == 5


def test_errors_are_cached_as_fresh_exceptions() -> None:
    bad = _versioned("bad-1", interval="0s")
    e1, e2 = error(bad), error(bad)
    assert e1 is not e2 and str(e1) == str(e2) and e1.field == e2.field == "spec.interval"


def test_objects_without_uid_are_parsed_every_time() -> None:
    o = obj(maxCheckpoints=4)
    assert policy_from_object(o).max_checkpoints == 4
    o["spec"]["maxCheckpoints"] = 6
    assert policy_from_object(o).max_checkpoints == 6


# --- overrides ---

POL = Policy(name="p", namespace="n", storage_uri="file:///x")


def test_the_override_annotations() -> None:
    assert set(OVERRIDES) == {
        "interval",
        "strategy",
        "save-steps",
        "max-checkpoints",
        "resume",
        "jit",
        "max-grace-period-seconds",
        "local-tier",
        "local-size-limit",
        "local-period-steps",
        "model-parameters",
        "progress-every-steps",
        "instrumentation-auto",
    }
    assert all(hasattr(POL, attr) for attr in OVERRIDES.values())


@pytest.mark.parametrize(
    ("suffix", "value", "attr", "expected"),
    [
        ("interval", "10m", "interval_seconds", 600),
        ("interval", " 600 ", "interval_seconds", 600),
        ("strategy", "epoch", "strategy", "epoch"),
        ("max-checkpoints", "5", "max_checkpoints", 5),
        ("resume", "No", "resume", False),
        ("jit", "yes", "jit", True),
        ("max-grace-period-seconds", "600", "max_grace_seconds", 600),
        ("local-tier", "1", "local_enabled", True),
        ("local-size-limit", " 16Gi", "local_size_limit", "16Gi"),
        ("local-period-steps", "7", "local_period_steps", 7),
        ("model-parameters", "7000000000", "local_model_parameters", 7_000_000_000),
        ("progress-every-steps", "3", "progress_every_steps", 3),
        ("instrumentation-auto", "true", "auto_instrumentation", True),
    ],
)
def test_valid_override(suffix: str, value: str, attr: str, expected: object) -> None:
    got, warnings = apply_overrides(POL, {f"kubeckpt.io/{suffix}": value})
    assert (getattr(got, attr), warnings) == (expected, [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("suffix", "value", "why"),
    [
        ("interval", "0s", "must be at least 1s, got '0s'"),
        ("interval", "soon", "invalid duration 'soon': expected <number><unit>"),
        ("interval", "9" * 20, f"must be at most 9223372036s, got {'9' * 20!r}"),
        ("strategy", "hourly", "expected one of time, steps, epoch"),
        ("save-steps", "0", "expected a positive integer"),
        ("save-steps", "²", "expected a positive integer"),  # isdigit() took it, int() did not
        ("max-checkpoints", "-1", "expected a positive integer"),
        ("resume", "maybe", "expected true or false"),
        ("max-grace-period-seconds", "10", "expected 30..86400"),
        ("local-size-limit", "abc", "not a quantity: 'abc'"),
        ("local-size-limit", "0", "must be positive: '0'"),
        ("local-size-limit", "1e999999999", "too large: '1e999999999'"),  # hung admission
    ],
)
def test_invalid_override_is_ignored_as_before(suffix: str, value: str, why: str) -> None:
    key = f"kubeckpt.io/{suffix}"
    got, warnings = apply_overrides(POL, {key: value})
    assert got == POL
    assert warnings == [f"kubeckpt: invalid {key}={value[:64]!r} ignored: {why}"]


def test_an_interval_past_float_range_is_a_warning() -> None:
    # float("9" * 400) is inf, and ceil(inf) raised OverflowError out of the admission
    _, warnings = apply_overrides(POL, {"kubeckpt.io/interval": "9" * 400})
    assert len(warnings) == 1 and "ignored: must be at most 9223372036s" in warnings[0]


def test_overrides_mixed_valid_invalid_unknown_reserved_foreign() -> None:
    got, warnings = apply_overrides(
        POL,
        {
            "kubeckpt.io/max-checkpoints": "5",
            "kubeckpt.io/resume": "maybe",
            "kubeckpt.io/bogus": "1",
            "kubeckpt.io/inject": "true",  # reserved: not an override, no warning
            "kubeckpt.io/status": "{}",
            "example.com/interval": "0s",  # not ours
            "kubeckpt.io/interval": "10m",
        },
    )
    assert (got.max_checkpoints, got.interval_seconds, got.resume) == (5, 600, True)
    assert warnings == [  # sorted by annotation, as before
        "kubeckpt: unknown annotation kubeckpt.io/bogus ignored",
        "kubeckpt: invalid kubeckpt.io/resume='maybe' ignored: expected true or false",
    ]


def test_override_values_that_are_not_strings() -> None:
    got, warnings = apply_overrides(
        POL,
        {"kubeckpt.io/max-checkpoints": 5, "kubeckpt.io/jit": ["x"], 7: "x"},  # type: ignore[dict-item]
    )
    assert got.max_checkpoints == 5
    assert warnings == ["kubeckpt: invalid kubeckpt.io/jit ignored: expected a string"]
    assert apply_overrides(POL, None)[0] == POL  # type: ignore[arg-type]


def test_on_unverifiable_checkpoints_defaults_to_fail_and_takes_two_values() -> None:
    assert policy_from_object(obj()).on_unverifiable_checkpoints == "Fail"
    got = policy_from_object(obj(onUnverifiableCheckpoints="StartFresh"))
    assert got.on_unverifiable_checkpoints == "StartFresh"
    message = str(error(obj(onUnverifiableCheckpoints="Ignore")))
    assert message.startswith("spec.onUnverifiableCheckpoints:"), message
