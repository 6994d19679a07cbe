"""Offline checks of the kubeckpt CRDs (config/crd/bases) and the kustomize tree against DESIGN.md.

No API server here: a small structural-schema checker, a defaulter and a validator that covers the
OpenAPI keywords the CRDs use stand in for it. The API-server test (tests/integration) checks what
only a server can (CEL, strict decoding).
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
BASES = CONFIG / "crd" / "bases"
GROUP = "kubeckpt.io"
VERSION = "v1alpha1"
POLICY_FILE = BASES / "kubeckpt.io_checkpointpolicies.yaml"
PROGRESS_FILE = BASES / "kubeckpt.io_trainingprogresses.yaml"
SAMPLE_FILE = CONFIG / "samples" / "kubeckpt.io_v1alpha1_checkpointpolicy.yaml"

# DESIGN.md, "CheckpointPolicy": every spec default, by dotted path.
DESIGN_DEFAULTS: dict[str, Any] = {
    "storage.mountPath": "/mnt/kubeckpt",
    "interval": "5m",
    "strategy": "time",
    "maxCheckpoints": 3,
    "resume": True,
    "jit.enabled": True,
    "jit.maxGracePeriodSeconds": 300,
    "localTier.enabled": False,
    "localTier.periodSteps": 100,
    "progress.updateEverySteps": 5,
    "instrumentation.auto": False,
}

# DESIGN.md, "Progress file" (the example plus the optional keys).
PROGRESS_EXAMPLE: dict[str, Any] = {
    "epoch": 2,
    "totalEpochs": 3,
    "step": 150,
    "totalSteps": 300,
    "loss": "0.4523",
    "learningRate": "0.000050",
    "percentComplete": "50.0",
    "estimatedTimeRemaining": "45m",
    "stepSeconds": "1.82",
    "lastUpdateTime": "2024-01-15T10:30:00Z",
    "resumedFrom": "checkpoint-100",
    "checkpointing": {
        "enabled": True,
        "latestCheckpoint": "/mnt/kubeckpt/ns/job/checkpoint-150",
        "checkpointsCreated": 3,
        "latestCheckpointTime": "2024-01-15T10:25:00Z",
        "lastSaveSeconds": "2.1",
        "lastStallSeconds": "0.08",
    },
    "accuracy": "0.91",
    "validationLoss": "0.51",
    "validationAccuracy": "0.88",
}
PROGRESS_COUNTS = ("epoch", "totalEpochs", "step", "totalSteps")

TP_COLUMNS = [
    ("Job", ".spec.jobRef.name", "string"),
    ("State", ".status.state", "string"),  # an extension of DESIGN.md's columns
    ("Step", ".status.step", "integer"),
    ("Percent", ".status.percentComplete", "string"),
    ("Loss", ".status.loss", "string"),
    ("ETA", ".status.estimatedTimeRemaining", "string"),
    ("Last-Checkpoint", ".status.checkpointing.latestCheckpointTime", "date"),
    ("Age", ".metadata.creationTimestamp", "date"),
]

VALUE_VALIDATION_KEYS = ("allOf", "anyOf", "oneOf", "not")
INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]


# --- helpers --------------------------------------------------------------------------------------
def load(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path.name}: expected one YAML document, found {len(docs)}"
    return docs[0]


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return version_of(crd)["schema"]["openAPIV3Schema"]


def node(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    for part in dotted.split("."):
        schema = schema["properties"][part]
    return schema


def walk(schema: dict[str, Any], path: str = ""):
    """Yield (path, node) for every schema node reachable through properties/items."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")


def rules(schema: dict[str, Any]) -> list[str]:
    return [v["rule"] for v in schema.get("x-kubernetes-validations", [])]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Default like the API server: missing properties with a default, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], v) for v in value]
    return value


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    raise AssertionError(f"unknown type {kind}")


def validate(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """OpenAPI validation for the keywords the CRDs use (no CEL); returns the errors."""
    where = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok("integer", value) or _type_ok("string", value)):
            return [f"{where}: {value!r} is neither an integer nor a string"]
    elif "type" in schema and not _type_ok(schema["type"], value):
        return [f"{where}: {value!r} is not of type {schema['type']}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{where}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if schema.get("format") == "date-time" and not re.fullmatch(
            r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", value
        ):
            errors.append(f"{where}: {value!r} is not a date-time")
    if _type_ok("integer", value):
        if value < schema.get("minimum", value):
            errors.append(f"{where}: {value} < minimum {schema['minimum']}")
        if value > schema.get("maximum", value):
            errors.append(f"{where}: {value} > maximum {schema['maximum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        for name, child in value.items():
            if name in props:
                errors += validate(props[name], child, f"{path}.{name}")
            elif isinstance(extra, dict):
                errors += validate(extra, child, f"{path}.{name}")
            elif props:  # an object schema without properties (metadata) is opaque here
                errors.append(f"{path}.{name}: unknown field")
        if len(value) > schema.get("maxProperties", len(value)):
            errors.append(f"{where}: more than {schema['maxProperties']} properties")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{where}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, f"{path}[{i}]")
    return errors


def go_duration_seconds(text: str) -> float:
    """Parse the subset of Go duration syntax the interval pattern allows."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)", text)
    assert "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def cel_regex(rule: str) -> str:
    """The regex of a rule of the form `self.matches(r'...')` (or its negation)."""
    m = re.fullmatch(r"!?self\.matches\(r?'(.*?)'\)(\s*\|\|.*)?", rule.strip(), re.S)
    assert m, f"not a self.matches(r'...') rule: {rule}"
    return m.group(1)


@pytest.fixture(scope="module")
def policy_crd() -> dict[str, Any]:
    return load(POLICY_FILE)


@pytest.fixture(scope="module")
def progress_crd() -> dict[str, Any]:
    return load(PROGRESS_FILE)


@pytest.fixture(scope="module")
def policy_root(policy_crd: dict[str, Any]) -> dict[str, Any]:
    return root_schema(policy_crd)


@pytest.fixture(scope="module")
def spec_schema(policy_root: dict[str, Any]) -> dict[str, Any]:
    return policy_root["properties"]["spec"]


@pytest.fixture(scope="module")
def progress_root(progress_crd: dict[str, Any]) -> dict[str, Any]:
    return root_schema(progress_crd)


def all_crds() -> list[Any]:
    return [
        pytest.param(POLICY_FILE, "checkpointpolicies", "CheckpointPolicy", "ckptpol", id="policy"),
        pytest.param(PROGRESS_FILE, "trainingprogresses", "TrainingProgress", "tp", id="progress"),
    ]


# --- both CRDs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_crd_identity(path: Path, plural: str, kind: str, short: str) -> None:
    crd = load(path)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
    assert path.name == f"{GROUP}_{plural}.yaml"
    spec = crd["spec"]
    assert spec["group"] == GROUP
    assert spec["scope"] == "Namespaced"
    names = spec["names"]
    assert names["plural"] == plural
    assert names["kind"] == kind
    assert names["singular"] == kind.lower()
    assert names["listKind"] == f"{kind}List"
    assert names["shortNames"] == [short]
    assert names["categories"] == ["kubeckpt"]
    version = version_of(crd)
    assert version["name"] == VERSION
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_api_package_declares_the_crds(path: Path, plural: str, kind: str, short: str) -> None:
    """kubeckpt_api.groupversion, which the webhook, the controller and the CLI name the API by,
    says what the CRD says: group, version, kind, plural, singular, short names, status."""
    from kubeckpt_api import groupversion as gv

    crd = load(path)
    (api_kind,) = [k for k in gv.KINDS if k.kind == crd["spec"]["names"]["kind"]]
    names = crd["spec"]["names"]
    assert (gv.GROUP, gv.VERSION) == (crd["spec"]["group"], version_of(crd)["name"])
    assert gv.API_VERSION == f"{crd['spec']['group']}/{version_of(crd)['name']}"
    assert (api_kind.plural, api_kind.singular) == (names["plural"], names["singular"])
    assert list(api_kind.short_names) == names["shortNames"]
    assert api_kind.crd_name == crd["metadata"]["name"]
    res = api_kind.resource
    assert (res.group, res.version, res.plural, res.kind) == (gv.GROUP, gv.VERSION, plural, kind)
    assert res.namespaced == (crd["spec"]["scope"] == "Namespaced")
    assert res.subresources == frozenset(version_of(crd).get("subresources") or {})


def structural_errors(schema: dict[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    """Violations of the structural-schema rules (apiextensions.k8s.io/v1) that we can see offline.

    Every node is typed, except int-or-string (with exactly the anyOf integer/string pattern) and
    preserve-unknown-fields nodes; properties only on objects, items only on arrays; value
    validations (allOf/anyOf/oneOf/not) carry no type, default, description or nested structure.
    """
    errors: list[str] = []
    where = path or "<root>"
    int_or_string = schema.get("x-kubernetes-int-or-string", False)
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if "type" not in schema and not (int_or_string or preserve):
        errors.append(f"{where}: no type")
    if int_or_string:
        if "type" in schema:
            errors.append(f"{where}: int-or-string must not have a type")
        if preserve:
            errors.append(f"{where}: int-or-string must not preserve unknown fields")
        if schema.get("anyOf", INT_OR_STRING_ANYOF) != INT_OR_STRING_ANYOF:
            errors.append(f"{where}: int-or-string anyOf must be exactly integer, string")
    if "properties" in schema and schema.get("type") != "object":
        errors.append(f"{where}: properties on a non-object")
    if "additionalProperties" in schema:
        if schema.get("type") != "object":
            errors.append(f"{where}: additionalProperties on a non-object")
        if "properties" in schema:
            errors.append(f"{where}: both properties and additionalProperties")
    if "items" in schema and schema.get("type") != "array":
        errors.append(f"{where}: items on a non-array")
    if schema.get("type") == "array" and "items" not in schema:
        errors.append(f"{where}: array without items")
    for key in VALUE_VALIDATION_KEYS:
        if key not in schema or (int_or_string and key == "anyOf"):
            continue
        nested = schema[key] if isinstance(schema[key], list) else [schema[key]]
        for sub in nested:
            for bad in ("type", "default", "description", "nullable", "items", "properties"):
                if bad in sub:
                    errors.append(f"{where}.{key}: '{bad}' inside a value validation")
    if not root and "metadata" in schema.get("properties", {}):
        pass  # nested metadata is just another field below the root
    if root:
        meta = schema["properties"]["metadata"]
        if meta != {"type": "object"}:
            errors.append("metadata: the root metadata schema may only be {type: object}")
    list_type = schema.get("x-kubernetes-list-type")
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        errors.append(f"{where}: bad x-kubernetes-list-type {list_type}")
    if list_type == "map":
        item = schema["items"]
        keys = schema.get("x-kubernetes-list-map-keys", [])
        if not keys:
            errors.append(f"{where}: list-type map without list-map-keys")
        for key in keys:
            if key not in item.get("required", []) and "default" not in item["properties"][key]:
                errors.append(f"{where}: list-map key {key} is neither required nor defaulted")
            if item["properties"][key].get("type") not in ("string", "integer"):
                errors.append(f"{where}: list-map key {key} is not a scalar")
    for name, child in schema.get("properties", {}).items():
        errors += structural_errors(child, f"{path}.{name}", root=False)
    if isinstance(schema.get("additionalProperties"), dict):
        errors += structural_errors(schema["additionalProperties"], f"{path}.*", root=False)
    if isinstance(schema.get("items"), dict):
        errors += structural_errors(schema["items"], f"{path}[]", root=False)
    return errors


def _root_with(field: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"metadata": {"type": "object"}, "x": field}}


@pytest.mark.parametrize(
    "field",
    [
        {"description": "no type"},
        {"type": "object", "properties": {"y": {"description": "nested, no type"}}},
        {"type": "array"},
        {"type": "array", "items": {"properties": {"y": {"type": "string"}}}},
        {"type": "string", "items": {"type": "string"}},
        {"type": "string", "properties": {"y": {"type": "string"}}},
        {"x-kubernetes-int-or-string": True, "type": "string"},
        {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "string"}]},
        {"type": "string", "anyOf": [{"type": "string"}]},
        {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "map"},
    ],
)
def test_structural_checker_catches_violations(field: dict[str, Any]) -> None:
    assert structural_errors(_root_with({"type": "string"})) == []
    assert structural_errors(_root_with(field)), field
    assert structural_errors({"type": "object", "properties": {"metadata": {"type": "string"}}})


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_schema_is_structural(path: Path, plural: str, kind: str, short: str) -> None:
    schema = root_schema(load(path))
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert structural_errors(schema) == []


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_no_unknown_fields_preserved(path: Path, plural: str, kind: str, short: str) -> None:
    # Nothing in either CRD needs to keep unknown fields: a progress file's extra keys are dropped.
    preserved = [
        p for p, n in walk(root_schema(load(path))) if n.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert preserved == []


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_every_field_is_described(path: Path, plural: str, kind: str, short: str) -> None:
    schema = root_schema(load(path))
    missing = [
        p
        for p, n in walk(schema)
        if p not in ("", ".metadata")
        and not p.endswith(("[]", ".*"))
        and not n.get("description", "").strip()
    ]
    assert missing == []
    assert schema.get("description", "").strip()


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_defaults_satisfy_their_own_schema(path: Path, plural: str, kind: str, short: str) -> None:
    schema = root_schema(load(path))
    defaulted = [(p, n) for p, n in walk(schema) if "default" in n]
    for p, n in defaulted:
        value = apply_defaults(n, copy.deepcopy(n["default"]))
        assert validate(n, value, p) == [], p


@pytest.mark.parametrize(("path", "plural", "kind", "short"), all_crds())
def test_status_conditions_are_metav1_conditions(
    path: Path, plural: str, kind: str, short: str
) -> None:
    conditions = node(root_schema(load(path)), "status.conditions")
    assert conditions["type"] == "array"
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert set(item["properties"]) == {
        "type",
        "status",
        "observedGeneration",
        "lastTransitionTime",
        "reason",
        "message",
    }
    assert set(item["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"
    assert item["properties"]["observedGeneration"]["format"] == "int64"
    assert item["properties"]["message"]["maxLength"] == 32768
    observed = node(root_schema(load(path)), "status.observedGeneration")
    assert (observed["type"], observed["format"]) == ("integer", "int64")


def test_condition_schemas_are_identical(
    policy_root: dict[str, Any], progress_root: dict[str, Any]
) -> None:
    a = node(policy_root, "status.conditions")["items"]
    b = node(progress_root, "status.conditions")["items"]
    assert a == b


# --- CheckpointPolicy -----------------------------------------------------------------------------
def test_policy_spec_fields_match_design(spec_schema: dict[str, Any]) -> None:
    assert set(spec_schema["properties"]) == {
        "selector",
        "storage",
        "interval",
        "strategy",
        "saveSteps",
        "maxCheckpoints",
        "resume",
        "jit",
        "localTier",
        "progress",
        "instrumentation",
        "onUnverifiableCheckpoints",  # an extension (docs/contract.md, issue 27)
    }
    assert set(node(spec_schema, "storage")["properties"]) == {"uri", "mountPath", "secretRef"}
    assert set(node(spec_schema, "jit")["properties"]) == {"enabled", "maxGracePeriodSeconds"}
    assert set(node(spec_schema, "localTier")["properties"]) == {
        "enabled",
        "sizeLimit",
        "modelParameters",
        "periodSteps",
        "peerCopy",  # an extension (docs/contract.md, issue 28)
    }
    assert node(spec_schema, "strategy")["enum"] == ["time", "steps", "epoch"]


def test_policy_defaults_match_design(spec_schema: dict[str, Any]) -> None:
    for dotted, expected in DESIGN_DEFAULTS.items():
        got = node(spec_schema, dotted).get("default", "<no default>")
        assert got == expected and type(got) is type(expected), dotted
    # No other leaf has a default: DESIGN.md lists them all.
    leaves = {
        p.lstrip(".") for p, n in walk(spec_schema) if "default" in n and n.get("type") != "object"
    }
    assert leaves == set(DESIGN_DEFAULTS)


def test_minimal_policy_defaults_to_design_table(spec_schema: dict[str, Any]) -> None:
    # Nested objects default to {} so their own defaults apply when the object is omitted.
    spec = apply_defaults(spec_schema, {"storage": {"uri": "pvc://ckpt/team-a"}})
    assert validate(spec_schema, spec, "spec") == []

    def get(dotted: str) -> Any:
        value: Any = spec
        for part in dotted.split("."):
            value = value[part]
        return value

    assert {k: get(k) for k in DESIGN_DEFAULTS} == DESIGN_DEFAULTS
    assert "selector" not in spec
    assert "saveSteps" not in spec
    assert "sizeLimit" not in spec["localTier"]
    assert "secretRef" not in spec["storage"]


def test_storage_uri_is_required(policy_root: dict[str, Any], spec_schema: dict[str, Any]) -> None:
    assert "spec" in policy_root["required"]
    assert "storage" in spec_schema["required"]
    assert node(spec_schema, "storage")["required"] == ["uri"]
    assert "default" not in node(spec_schema, "storage")
    errors = validate(spec_schema, apply_defaults(spec_schema, {"storage": {}}), "spec")
    assert errors == ["spec.storage.uri: required"]
    assert node(spec_schema, "storage.secretRef")["required"] == ["name"]


@pytest.mark.parametrize(
    "uri",
    [
        "pvc://training-checkpoints/llm",
        "pvc://ckpt",
        "pvc://ckpt/",
        "pvc://team.ckpt/a/b-c/d_e",
        "s3://my-bucket/ckpt/team-a",
        "s3://my.bucket",
        "file:///data/ckpt",
        "file:///mnt/kubeckpt",
    ],
)
def test_storage_uri_accepts(spec_schema: dict[str, Any], uri: str) -> None:
    schema = node(spec_schema, "storage.uri")
    assert validate(schema, uri) == []
    for rule in rules(schema):
        matched = re.search(cel_regex(rule), uri) is not None
        assert matched != rule.startswith("!"), rule


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "http://example.com/ckpt",
        "pvc:///data",
        "pvc://Claim/data",
        "pvc://-claim/data",
        "pvc://claim/with space",
        "s3://b/prefix",
        "s3://Bucket/prefix",
        "s3:/bucket/prefix",
        "file://relative/path",
        "file:///",
        "/mnt/kubeckpt",
        "gs://bucket/prefix",
        "pvc://ckpt/../etc",
        "file:///data/..",
    ],
)
def test_storage_uri_rejects(spec_schema: dict[str, Any], uri: str) -> None:
    schema = node(spec_schema, "storage.uri")
    rejected_by_cel = any(
        (re.search(cel_regex(rule), uri) is not None) == rule.startswith("!")
        for rule in rules(schema)
    )
    assert validate(schema, uri) or rejected_by_cel


def test_storage_uri_cel_rule_mirrors_pattern(spec_schema: dict[str, Any]) -> None:
    # The CEL rule exists only for its readable message: it accepts exactly what the pattern does.
    schema = node(spec_schema, "storage.uri")
    scheme_rules = [r for r in rules(schema) if not r.startswith("!")]
    assert [cel_regex(r) for r in scheme_rules] == [schema["pattern"]]
    messages = [v["message"] for v in schema["x-kubernetes-validations"]]
    assert any("pvc://" in m and "s3://" in m and "file:///" in m for m in messages)


def test_mount_path_is_absolute(spec_schema: dict[str, Any]) -> None:
    schema = node(spec_schema, "storage.mountPath")
    for ok in ("/mnt/kubeckpt", "/checkpoints", "/a/b_c-d.e"):
        assert validate(schema, ok) == [], ok
    for bad in ("mnt/kubeckpt", "/", "", "/mnt/kubeckpt/", "/a b", "/a:b"):
        assert validate(schema, bad), bad


@pytest.mark.parametrize("interval", ["5m", "1h30m", "90s", "1h", "1.5h", "2h45m30s", "1500ms"])
def test_interval_accepts_go_durations(spec_schema: dict[str, Any], interval: str) -> None:
    schema = node(spec_schema, "interval")
    assert validate(schema, interval) == []
    assert go_duration_seconds(interval) >= 1


@pytest.mark.parametrize(
    "interval", ["", "5", "5 m", "-5m", "+5m", "1d", "m", "5min", "5M", "1h 30m", "PT5M", "5m0"]
)
def test_interval_rejects_non_durations(spec_schema: dict[str, Any], interval: str) -> None:
    assert validate(node(spec_schema, "interval"), interval)


def test_interval_default_and_cel_minimum(spec_schema: dict[str, Any]) -> None:
    schema = node(spec_schema, "interval")
    assert validate(schema, schema["default"]) == []
    assert go_duration_seconds(schema["default"]) == 300
    (rule,) = rules(schema)
    # The CEL rule only evaluates duration() on strings that passed the pattern (CEL runs even when
    # the pattern fails, and duration() of garbage would be an evaluation error).
    assert cel_regex(rule) == schema["pattern"]
    assert "duration(self) >= duration('1s')" in rule


def test_strategy_steps_requires_save_steps(spec_schema: dict[str, Any]) -> None:
    (rule,) = spec_schema["x-kubernetes-validations"]
    assert "self.strategy != 'steps'" in rule["rule"]
    assert "has(self.saveSteps)" in rule["rule"]
    assert "saveSteps" in rule["message"]
    assert rule.get("fieldPath") == ".saveSteps"
    assert node(spec_schema, "saveSteps")["minimum"] == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("maxCheckpoints", -1),
        ("maxCheckpoints", 0),
        ("maxCheckpoints", "3"),
        ("strategy", "weekly"),
        ("strategy", "Time"),
        ("saveSteps", 0),
        ("resume", "yes"),
        ("jit", {"maxGracePeriodSeconds": 29}),
        ("jit", {"maxGracePeriodSeconds": 86401}),
        ("jit", {"enabled": "true"}),
        ("localTier", {"periodSteps": 0}),
        ("localTier", {"modelParameters": 0}),
        ("localTier", {"sizeLimit": "lots"}),
        ("localTier", {"sizeLimit": "-1Gi"}),
        ("localTier", {"sizeLimit": 1.5}),
        ("progress", {"updateEverySteps": 0}),
        ("instrumentation", {"auto": 1}),
        ("selector", {"matchExpressions": [{"key": "a", "operator": "Has"}]}),
        ("selector", {"matchLabels": {"a": 1}}),
        ("unknownField", True),
    ],
)
def test_policy_rejects(spec_schema: dict[str, Any], field: str, value: Any) -> None:
    spec = apply_defaults(spec_schema, {"storage": {"uri": "pvc://ckpt"}, field: value})
    assert validate(spec_schema, spec, "spec")


@pytest.mark.parametrize("size", ["64Gi", "500M", "1.5Ti", "1e9", 68719476736])
def test_local_tier_size_limit_accepts_quantities(spec_schema: dict[str, Any], size: Any) -> None:
    schema = node(spec_schema, "localTier.sizeLimit")
    assert validate(schema, size) == []
    (rule,) = rules(schema)
    assert "type(self) == int ? self >= 1" in rule
    if isinstance(size, str):
        assert re.search(r"^[^eE]*[1-9]", size)  # the CEL rule's positivity check


def test_local_tier_size_limit_is_int_or_string(spec_schema: dict[str, Any]) -> None:
    schema = node(spec_schema, "localTier.sizeLimit")
    assert schema["x-kubernetes-int-or-string"] is True
    assert "type" not in schema
    for zero in ("0", "0Gi", "0.0", "0e3"):
        assert not re.search(r"^[^eE]*[1-9]", zero), zero
    # DESIGN: with neither sizeLimit nor modelParameters the policy stays valid.
    assert "neither" in node(spec_schema, "localTier")["description"]


def test_selector_is_a_label_selector(spec_schema: dict[str, Any]) -> None:
    selector = node(spec_schema, "selector")
    assert selector["type"] == "object"
    assert set(selector["properties"]) == {"matchLabels", "matchExpressions"}
    assert selector["properties"]["matchLabels"]["additionalProperties"]["type"] == "string"
    expr = selector["properties"]["matchExpressions"]["items"]
    assert set(expr["required"]) == {"key", "operator"}
    assert expr["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist"]
    assert expr["properties"]["values"]["items"]["type"] == "string"
    assert any("values" in r for r in rules(expr))


def test_policy_printer_columns(policy_crd: dict[str, Any]) -> None:
    columns = [
        (c["name"], c["jsonPath"], c["type"])
        for c in version_of(policy_crd)["additionalPrinterColumns"]
    ]
    assert columns == [
        # Ready and Reason extend DESIGN.md's columns: the status the reconciler writes.
        ("Ready", '.status.conditions[?(@.type=="Ready")].status', "string"),
        ("Reason", '.status.conditions[?(@.type=="Ready")].reason', "string"),
        ("Storage", ".spec.storage.uri", "string"),
        ("Interval", ".spec.interval", "string"),
        ("Strategy", ".spec.strategy", "string"),
        ("Max", ".spec.maxCheckpoints", "integer"),
        ("JIT", ".spec.jit.enabled", "boolean"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]


def test_policy_cel_rules_have_messages(policy_root: dict[str, Any]) -> None:
    for path, n in walk(policy_root):
        for v in n.get("x-kubernetes-validations", []):
            assert v.get("message") or v.get("messageExpression"), path
            # CEL cost estimation needs bounded strings and lists below a rule.
            for sub_path, sub in walk(n, path):
                if sub.get("type") == "string" and "enum" not in sub:
                    assert "maxLength" in sub, sub_path
                if sub.get("type") == "array":
                    assert "maxItems" in sub, sub_path


# --- TrainingProgress -----------------------------------------------------------------------------
def test_progress_printer_columns(progress_crd: dict[str, Any]) -> None:
    columns = version_of(progress_crd)["additionalPrinterColumns"]
    default_view = [(c["name"], c["jsonPath"], c["type"]) for c in columns if not c.get("priority")]
    assert default_view == TP_COLUMNS
    wide_only = [c["name"] for c in columns if c.get("priority")]
    assert {"Source", "Pod"} <= set(wide_only)
    assert all(c.get("priority", 0) in (0, 1) for c in columns)


def test_progress_job_ref(progress_root: dict[str, Any]) -> None:
    assert progress_root["required"] == ["spec"]
    spec = progress_root["properties"]["spec"]
    assert spec["required"] == ["jobRef"]
    job_ref = spec["properties"]["jobRef"]
    assert set(job_ref["required"]) == {"apiVersion", "kind", "name"}
    assert set(job_ref["properties"]) == {"apiVersion", "kind", "name"}
    assert all(p["type"] == "string" for p in job_ref["properties"].values())


def test_progress_status_fields(progress_root: dict[str, Any]) -> None:
    status = progress_root["properties"]["status"]
    props = status["properties"]
    for name in PROGRESS_COUNTS:
        assert (props[name]["type"], props[name]["format"], props[name]["minimum"]) == (
            "integer",
            "int64",
            0,
        ), name
    for name, value in PROGRESS_EXAMPLE.items():
        if isinstance(value, str) and name != "lastUpdateTime":
            assert props[name]["type"] == "string", name
    assert props["lastUpdateTime"]["format"] == "date-time"
    assert props["lastPollTime"]["format"] == "date-time"
    assert props["source"]["enum"] == ["exec", "terminationMessage", "push"]
    assert props["observedPod"]["type"] == "string"
    checkpointing = props["checkpointing"]["properties"]
    assert checkpointing["enabled"]["type"] == "boolean"
    assert checkpointing["checkpointsCreated"]["type"] == "integer"
    assert checkpointing["latestCheckpointTime"]["format"] == "date-time"
    for name in ("latestCheckpoint", "lastSaveSeconds", "lastStallSeconds"):
        assert checkpointing[name]["type"] == "string", name
    description = props["conditions"]["description"]
    for condition in ("Progressing", "Stalled", "Checkpointing", "Completed"):
        assert condition in description


def test_design_progress_file_fits_status(progress_root: dict[str, Any]) -> None:
    status_schema = progress_root["properties"]["status"]
    status = {
        **PROGRESS_EXAMPLE,
        "source": "exec",
        "observedPod": "llama-ft-master-0",
        "lastPollTime": "2024-01-15T10:30:05Z",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Progressing",
                "status": "True",
                "reason": "StepAdvanced",
                "message": "step 150 of 300",
                "lastTransitionTime": "2024-01-15T10:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    assert validate(status_schema, status, "status") == []
    # Every key of the progress file has a home in the status (none is silently pruned).
    assert set(PROGRESS_EXAMPLE) <= set(status_schema["properties"])
    # ...plus the runtime's keys beyond DESIGN.md's example: why the latest checkpoint exists,
    # the failure accounting and the local tier (trainer_runtime.contract.CheckpointingStatus).
    from kubeckpt_api.status_model import CheckpointingStatus
    from trainer_runtime.contract.progress import _CHECKPOINTING_KEYS

    schema_keys = set(status_schema["properties"]["checkpointing"]["properties"])
    assert schema_keys == set(_CHECKPOINTING_KEYS) | {"latestCheckpointReason", "resumedTier"}
    assert schema_keys == set(CheckpointingStatus.model_fields)
    failing = {
        "failedSaves": 2,
        "lastError": "rank 1: OSError: [Errno 28] No space left on device",
        "lastFailedStep": 140,
        "latestLocalCheckpoint": "/run/kubeckpt/local/checkpoint-149",
        "localCheckpointsCreated": 49,
        "resumedTier": "local (peer copy)",
    }
    status["checkpointing"] = {**status["checkpointing"], **failing}
    assert validate(status_schema, status, "status") == []


def test_progress_status_strings_are_bounded(progress_root: dict[str, Any]) -> None:
    # A hostile progress file must not bloat etcd: every free-form string has a maxLength.
    unbounded = [
        p
        for p, n in walk(progress_root["properties"]["status"], "status")
        if n.get("type") == "string"
        and "enum" not in n
        and "format" not in n
        and "maxLength" not in n
    ]
    assert unbounded == []
    status_schema = progress_root["properties"]["status"]
    assert validate(status_schema, {"loss": "9" * 100_000}, "status")
    assert validate(status_schema, {"source": "stdout"}, "status")
    assert validate(status_schema, {"step": -1}, "status")


# --- kustomize and samples ------------------------------------------------------------------------
def kustomization(directory: Path) -> dict[str, Any]:
    return load(directory / "kustomization.yaml")


def test_crd_kustomization_lists_both() -> None:
    k = kustomization(CONFIG / "crd")
    assert k["resources"] == [
        "bases/kubeckpt.io_checkpointpolicies.yaml",
        "bases/kubeckpt.io_trainingprogresses.yaml",
    ]
    assert sorted(p.name for p in BASES.glob("*.yaml")) == sorted(
        Path(r).name for r in k["resources"]
    )


def test_default_kustomization() -> None:
    k = kustomization(CONFIG / "default")
    assert k["namespace"] == "kubeckpt-system"
    assert "../crd" in k["resources"]
    for resource in k["resources"]:
        assert (CONFIG / "default" / resource).exists(), resource
    ns = load(CONFIG / "default" / "namespace.yaml")
    assert (ns["kind"], ns["metadata"]["name"]) == ("Namespace", "kubeckpt-system")
    assert ns["metadata"]["labels"]["app.kubernetes.io/name"] == "kubeckpt"


def test_sample_policy_is_valid(policy_root: dict[str, Any]) -> None:
    assert (
        "kubeckpt.io_v1alpha1_checkpointpolicy.yaml"
        in kustomization(CONFIG / "samples")["resources"]
    )
    sample = load(SAMPLE_FILE)
    assert sample["apiVersion"] == f"{GROUP}/{VERSION}"
    assert sample["kind"] == "CheckpointPolicy"
    assert sample["spec"]["storage"]["uri"].startswith("pvc://")
    assert validate(policy_root, apply_defaults(policy_root, sample)) == []


@pytest.mark.parametrize("overlay", ["default", "samples"])
def test_kustomize_builds(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH: install it, or run `make binaries` and add its path"
    proc = subprocess.run(
        [kubectl, "kustomize", str(CONFIG / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    if overlay == "default":
        assert ("CustomResourceDefinition", "checkpointpolicies.kubeckpt.io") in kinds
        assert ("CustomResourceDefinition", "trainingprogresses.kubeckpt.io") in kinds
        assert ("Namespace", "kubeckpt-system") in kinds
        for d in docs:
            if d["kind"] == "CustomResourceDefinition":
                assert "namespace" not in d["metadata"]
    else:
        assert kinds == [("CheckpointPolicy", "default")]


def test_status_models_restate_the_schema(progress_root: dict[str, Any]) -> None:
    """kubeckpt_api/status_model.py fits a record to the status schema: its fields, types
    and limits must be the schema's, or the API server rejects or prunes what it writes."""
    from kubeckpt_api.status_model import CheckpointingStatus, RecordStatus, fits

    status = progress_root["properties"]["status"]["properties"]
    for model, props in (
        (RecordStatus, status),
        (CheckpointingStatus, status["checkpointing"]["properties"]),
    ):
        rules = fits(model)
        for name, info in model.model_fields.items():
            assert name in props, f"{model.__name__}.{name} is not in the schema"
            schema = props[name]
            if name in rules:
                rule = rules[name]
                assert schema["type"] == "string", name
                if rule.kind == "time":
                    assert schema.get("format") == "date-time", name
                else:
                    assert schema.get("maxLength") == rule.limit, (name, schema, rule)
            elif name != "checkpointing":
                want = {"int | None": "integer", "bool | None": "boolean"}[str(info.annotation)]
                assert schema["type"] == want, (name, schema)
