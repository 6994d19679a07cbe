"""The admission policies on kubeckpt's own ServiceAccounts (config/policy), as kustomize renders
them: every install carries them, each is bound to deny, the constants in their CEL are the code's
(the read commands, the progress file, the containers, the labels, the annotations), their account
patterns match the accounts an overlay renames, and no kubeckpt role can change them. Their CEL
compiles and acts on the real API server: tests/integration/test_service_account_policies.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.groupversion import GROUP, TRAINING_PROGRESS
from progress_controller.preemption_cost import (
    INT32_MAX,
    PRIORITY_BOOST_ANNOTATION,
    CostSettings,
    boost_for_cost,
)
from progress_controller.reading import PYTHON_READER, READ_CAP
from progress_controller.workload_boost import WORKLOAD_GROUP, WORKLOAD_PLURAL
from trainer_runtime.contract.env import POD_PROGRESS_FILE
from trainer_runtime.contract.jobkinds import JOB_KINDS
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_ANNOTATIONS,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
    checkpoint_step_value,
    checkpoint_time_value,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
VAP = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
RECONCILER_POLICIES = (
    "kubeckpt-reconciler-exec",
    "kubeckpt-reconciler-pods",
    "kubeckpt-reconciler-trainjobs",
    "kubeckpt-reconciler-workloads",
    "kubeckpt-reconciler-events",
)
WEBHOOK_POLICIES = ("kubeckpt-webhook-configuration", "kubeckpt-webhook-secrets")


def render(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH: install it, or run `make binaries` and add its path"
    proc = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render(CONFIG / "default")


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"].get("variables", [])}


def cel_list(items: list[Any]) -> str:
    """A CEL list literal of strings (or of lists of strings), as the policies write them."""
    return "[" + ", ".join(cel_list(i) if isinstance(i, list) else f"'{i}'" for i in items) + "]"


def account_pattern(policy: dict[str, Any]) -> str:
    (cond,) = policy["spec"]["matchConditions"]
    m = re.fullmatch(r"request\.userInfo\.username\.matches\('(.+)'\)", cond["expression"])
    assert m, cond
    return m.group(1)


def username(sa: dict[str, Any]) -> str:
    return f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"


@pytest.mark.parametrize("overlay", ["default", "local", "certmanager", "prometheus"])
def test_every_install_carries_the_policies_bound_to_deny(overlay: str) -> None:
    docs = render(CONFIG / overlay)
    policies, bindings = by_kind(docs, VAP), by_kind(docs, BINDING)
    assert set(policies) == {*RECONCILER_POLICIES, *WEBHOOK_POLICIES}
    assert {b["spec"]["policyName"] for b in bindings.values()} == set(policies)
    for b in bindings.values():
        assert b["spec"]["validationActions"] == ["Deny"], b
        assert "matchResources" not in b["spec"] and "paramRef" not in b["spec"], b
    for p in policies.values():
        assert p["spec"]["failurePolicy"] == "Fail", p["metadata"]["name"]
        assert p["metadata"]["labels"]["app.kubernetes.io/component"] == "policy"
        for v in p["spec"]["validations"]:
            assert v.get("message") or v.get("messageExpression"), v
    # Cluster-scoped: config/default's `namespace:` must not leave its namespace on them.
    for d in (*policies.values(), *bindings.values()):
        assert not d["metadata"].get("namespace"), d["metadata"]


def test_the_exec_policy_allows_exactly_the_read_commands(default: list[dict[str, Any]]) -> None:
    """reading.py's `cat <path>` and its python3 fallback, byte for byte (a CEL string literal
    of PYTHON_READER: JSON's escapes are CEL's), of the file the webhook injects, in a job kind's
    training container."""
    exec_policy = by_kind(default, VAP)["kubeckpt-reconciler-exec"]
    v = variables(exec_policy)
    assert v["progressFiles"] == cel_list([POD_PROGRESS_FILE]), v["progressFiles"]
    assert v["pythonReader"] == json.dumps(PYTHON_READER), (
        "the policy's pythonReader differs from progress_controller/reading.py PYTHON_READER; "
        f"set it to: {json.dumps(PYTHON_READER)}"
    )
    assert v["readCap"] == f"'{READ_CAP}'"
    assert v["containers"] == cel_list([k.target_container for k in JOB_KINDS])
    rules = exec_policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["*"],
            "operations": ["CONNECT"],
            "resources": ["pods/exec", "pods/attach", "pods/portforward", "pods/proxy"],
        }
    ]
    text = json.dumps(exec_policy["spec"]["validations"])
    for needle in (
        "variables.command == ['cat', path]",
        "['python3', '-c', variables.pythonReader, path, variables.readCap]",
        "kubeckpt.io/inject",
        "kubeckpt.io/progress-exec",
        "object.stdin",
        "object.tty",
    ):
        assert needle in text, needle


def test_the_write_policies_name_the_contracts_labels_and_annotations(
    default: list[dict[str, Any]],
) -> None:
    policies = by_kind(default, VAP)
    pods = variables(policies["kubeckpt-reconciler-pods"])
    assert pods["ours"] == cel_list(list(LAST_CHECKPOINT_ANNOTATIONS))
    assert pods["jobLabels"] == cel_list([k.name_label for k in JOB_KINDS])
    events = variables(policies["kubeckpt-reconciler-events"])
    assert events["jobKinds"] == cel_list([[k.group, k.kind] for k in JOB_KINDS])
    assert events["ownKinds"] == cel_list([[GROUP, TRAINING_PROGRESS.kind]])
    trainjobs = policies["kubeckpt-reconciler-trainjobs"]
    (rule,) = trainjobs["spec"]["matchConstraints"]["resourceRules"]
    (trainjob,) = [k for k in JOB_KINDS if k.progress_status_field]
    assert rule["apiGroups"] == [trainjob.group]
    assert rule["resources"] == [trainjob.plural, f"{trainjob.plural}/*"]
    assert f"k == '{trainjob.progress_status_field}'" in json.dumps(trainjobs["spec"])


def _value_patterns(default: list[dict[str, Any]]) -> dict[str, re.Pattern[str]]:
    """The annotation value patterns of the pods policy, by annotation (RE2 as Python reads it:
    these use nothing the two dialects disagree on)."""
    pods = by_kind(default, VAP)["kubeckpt-reconciler-pods"]
    text = " ".join(v["expression"] for v in pods["spec"]["validations"])
    found = re.findall(r"variables\.annotations\['([^']+)'\]\.matches\('([^']+)'\)", text)
    return {key: re.compile(pattern) for key, pattern in found}


@given(
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_the_annotation_values_the_controller_writes_pass(
    default: list[dict[str, Any]], when: datetime, step: int
) -> None:
    patterns = _value_patterns(default)
    assert set(patterns) == {LAST_CHECKPOINT_TIME_ANNOTATION, LAST_CHECKPOINT_STEP_ANNOTATION}
    time_value = checkpoint_time_value(when.isoformat())
    step_value = checkpoint_step_value(f"/ckpt/ns/job/checkpoint-{step}")
    assert time_value is not None and step_value is not None
    assert patterns[LAST_CHECKPOINT_TIME_ANNOTATION].search(time_value), time_value
    assert patterns[LAST_CHECKPOINT_STEP_ANNOTATION].search(step_value), step_value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (LAST_CHECKPOINT_TIME_ANNOTATION, "2024-01-15T10:25:00+01:00"),
        (LAST_CHECKPOINT_TIME_ANNOTATION, "2024-01-15T10:25:00.5Z"),
        (LAST_CHECKPOINT_TIME_ANNOTATION, "yesterday"),
        (LAST_CHECKPOINT_TIME_ANNOTATION, "2024-01-15T10:25:00Z\nx"),
        (LAST_CHECKPOINT_STEP_ANNOTATION, "-1"),
        (LAST_CHECKPOINT_STEP_ANNOTATION, "0150"),
        (LAST_CHECKPOINT_STEP_ANNOTATION, "1e3"),
        (LAST_CHECKPOINT_STEP_ANNOTATION, "1" * 20),
        (LAST_CHECKPOINT_STEP_ANNOTATION, ""),
    ],
)
def test_other_annotation_values_are_refused(
    default: list[dict[str, Any]], key: str, value: str
) -> None:
    assert _value_patterns(default)[key].search(value) is None


def _accounts(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Username of the reconciler's and the webhook's ServiceAccount in a rendered install."""
    out = {}
    for sa in by_kind(docs, "ServiceAccount").values():
        for who in ("reconciler", "webhook"):
            if f"kubeckpt-{who}" in sa["metadata"]["name"]:
                out[who] = username(sa)
    assert set(out) == {"reconciler", "webhook"}, out
    return out


@pytest.mark.parametrize("renamed", [False, True])
def test_each_policy_matches_its_account_and_not_the_other(
    default: list[dict[str, Any]], tmp_path: Path, renamed: bool
) -> None:
    """config/default's accounts, and those of an overlay with another namespace, a namePrefix
    and a nameSuffix (whose bindings still name their policies)."""
    docs = default
    if renamed:
        overlay = tmp_path / "overlay"
        overlay.mkdir()
        base = os.path.relpath(CONFIG / "default", overlay)  # kustomize takes no absolute base
        kustomization = {
            "resources": [base],
            "namespace": "ml-platform",
            "namePrefix": "acme-",
            "nameSuffix": "-v2",
        }
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        docs = render(overlay)
    accounts = _accounts(docs)
    if renamed:
        assert accounts["reconciler"] == (
            "system:serviceaccount:ml-platform:acme-kubeckpt-reconciler-v2"
        )
    policies = by_kind(docs, VAP)
    assert {b["spec"]["policyName"] for b in by_kind(docs, BINDING).values()} == set(policies)
    for name, policy in policies.items():
        who = "webhook" if "kubeckpt-webhook" in name else "reconciler"
        other = "reconciler" if who == "webhook" else "webhook"
        pattern = re.compile(account_pattern(policy))
        assert pattern.search(accounts[who]), (name, accounts[who])
        assert not pattern.search(accounts[other]), (name, accounts[other])
        for stranger in (
            "system:serviceaccount:kubeckpt-system:default",
            "kubernetes-admin",
            f"{accounts[who]}:x",  # not a ServiceAccount's username
            "kubeckpt-reconciler",
        ):
            assert not pattern.search(stranger), (name, stranger)


def test_no_kubeckpt_role_can_change_the_policies(default: list[dict[str, Any]]) -> None:
    """Nothing the install binds to any account grants a write on admission configuration,
    beyond the webhook's get/patch of its own MutatingWebhookConfiguration by name."""
    roles = [d for d in default if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role.get("rules", []):
            assert "*" not in rule.get("verbs", []) and "*" not in rule.get("apiGroups", [])
            if "admissionregistration.k8s.io" not in rule.get("apiGroups", []):
                continue
            assert role["metadata"]["name"] == "kubeckpt-webhook", role["metadata"]["name"]
            assert rule == {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["kubeckpt-webhook"],
                "verbs": ["get", "patch"],
            }


def test_the_webhook_policy_spares_only_the_ca_bundle(default: list[dict[str, Any]]) -> None:
    policy = by_kind(default, VAP)["kubeckpt-webhook-configuration"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ]
    text = json.dumps(policy["spec"]["validations"])
    assert "k == 'caBundle'" in text and "k == 'clientConfig'" in text
    # The webhook's certificate manager sends a JSON patch of caBundle alone (its tests pin it);
    # the metadata it may not change has no exception but what the API server sets itself.
    assert variables(policy)["serverSet"] == cel_list(
        ["managedFields", "resourceVersion", "generation"]
    )


def _boost_pattern(default: list[dict[str, Any]]) -> re.Pattern[str]:
    policy = by_kind(default, VAP)["kubeckpt-reconciler-workloads"]
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    (pattern,) = re.findall(
        r"variables\.annotations\['"
        + re.escape(PRIORITY_BOOST_ANNOTATION)
        + r"'\]\.matches\('([^']+)'\)",
        text,
    )
    return re.compile(pattern)


def test_the_workload_policy_names_the_boost_annotation_and_the_job_kinds(
    default: list[dict[str, Any]],
) -> None:
    policy = by_kind(default, VAP)["kubeckpt-reconciler-workloads"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [WORKLOAD_GROUP]
    assert rule["resources"] == [WORKLOAD_PLURAL, f"{WORKLOAD_PLURAL}/*"]
    names = variables(policy)
    assert names["ours"] == cel_list([PRIORITY_BOOST_ANNOTATION])
    assert names["jobKinds"] == cel_list([[k.group, k.kind] for k in JOB_KINDS])
    assert names["serverSet"] == cel_list(["managedFields", "resourceVersion", "generation"])


@given(st.integers(1, INT32_MAX), st.floats(0, 10 * 86400))
def test_the_boost_values_the_controller_writes_pass(
    default: list[dict[str, Any]], max_boost: int, cost: float
) -> None:
    value = str(boost_for_cost(cost, CostSettings(max_boost=max_boost)))
    assert _boost_pattern(default).search(value), value


@pytest.mark.parametrize("value", ["-1", "007", "1e3", "", " 5", "5\n1", "12345678901"])
def test_other_boost_values_are_refused(default: list[dict[str, Any]], value: str) -> None:
    assert _boost_pattern(default).search(value) is None


def test_the_preemption_cost_component_turns_the_flag_on_with_its_rights(tmp_path: Path) -> None:
    """Off in every install (config/default has neither the flag nor the right to patch
    Workloads, only to read them, for why a job is suspended); an overlay that adds the component
    gets both, the patch right and nothing else, and keeps every policy."""
    default = render(CONFIG / "default")
    reconciler = by_kind(default, "Deployment")["kubeckpt-reconciler"]
    assert (
        "--preemption-cost" not in reconciler["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    workload_rules = [
        r
        for role in by_kind(default, "ClusterRole").values()
        for r in role.get("rules", [])
        if WORKLOAD_GROUP in r.get("apiGroups", [])
    ]
    assert workload_rules == [
        {
            "apiGroups": [WORKLOAD_GROUP],
            "resources": [WORKLOAD_PLURAL],
            "verbs": ["get", "list", "watch"],
        }
    ]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "resources": [os.path.relpath(CONFIG / "default", overlay)],
        "components": [os.path.relpath(CONFIG / "components" / "kueue-preemption-cost", overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = render(overlay)
    reconciler = by_kind(docs, "Deployment")["kubeckpt-reconciler"]
    assert "--preemption-cost" in reconciler["spec"]["template"]["spec"]["containers"][0]["args"]
    role = by_kind(docs, "ClusterRole")["kubeckpt-reconciler-preemption-cost"]
    assert role["rules"] == [
        {
            "apiGroups": [WORKLOAD_GROUP],
            "resources": [WORKLOAD_PLURAL],
            "verbs": ["patch"],
        }
    ]
    binding = by_kind(docs, "ClusterRoleBinding")["kubeckpt-reconciler-preemption-cost"]
    assert binding["roleRef"]["name"] == "kubeckpt-reconciler-preemption-cost"
    subjects = [f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]]
    assert subjects == [_accounts(docs)["reconciler"]]
    assert set(by_kind(docs, VAP)) == {*RECONCILER_POLICIES, *WEBHOOK_POLICIES}


def test_the_progress_push_component_serves_the_endpoint_with_the_review_right(
    tmp_path: Path,
) -> None:
    """Off in config/default (no push port, no Service); with the component (on top of
    config/certmanager, which issues its certificate) the reconciler serves it on its Service
    from the mounted Secret. Checking the pods' tokens needs `create` on tokenreviews, which the
    reconciler's role already grants (README, threat model) and nothing more."""
    default = render(CONFIG / "default")
    args = by_kind(default, "Deployment")["kubeckpt-reconciler"]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert not any(a.startswith("--progress-push-port") for a in args)
    assert "kubeckpt-progress" not in by_kind(default, "Service")
    review_rules = [
        r
        for r in by_kind(default, "ClusterRole")["kubeckpt-reconciler"]["rules"]
        if "tokenreviews" in r.get("resources", [])
    ]
    assert [r["verbs"] for r in review_rules] == [["create"]]
    assert review_rules[0]["apiGroups"] == ["authentication.k8s.io"]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "resources": [os.path.relpath(CONFIG / "certmanager", overlay)],
        "components": [os.path.relpath(CONFIG / "components" / "progress-push", overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = render(overlay)
    pod = by_kind(docs, "Deployment")["kubeckpt-reconciler"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert "--progress-push-port=8444" in c["args"]
    assert "--progress-push-cert-dir=/etc/kubeckpt/progress-certs" in c["args"]
    assert {"name": "https-progress", "containerPort": 8444} in c["ports"]
    assert pod["volumes"] == [
        {"name": "progress-certs", "secret": {"secretName": "kubeckpt-progress-tls"}}
    ]
    svc = by_kind(docs, "Service")["kubeckpt-progress"]
    assert svc["spec"]["ports"] == [
        {"name": "https-progress", "port": 443, "targetPort": "https-progress"}
    ]
    cert = by_kind(docs, "Certificate")["kubeckpt-progress"]
    assert "kubeckpt-progress.kubeckpt-system.svc" in cert["spec"]["dnsNames"]
    # Every policy still bound to deny.
    assert set(by_kind(docs, "ValidatingAdmissionPolicy")) == set(
        by_kind(default, "ValidatingAdmissionPolicy")
    )


def test_the_progress_push_component_hands_pods_a_stable_ca_through_the_webhook(
    tmp_path: Path,
) -> None:
    """cert-manager's CA bootstrap: self-signed Issuer -> CA Certificate (isCA, 10 years) -> CA
    Issuer -> serving Certificate, so a renewal keeps the CA pods trust. The webhook mounts the CA
    Secret's ca.crt alone (optional: it serves before cert-manager issued it) and says where with
    --progress-push-ca-file; no role, binding or policy changes for it (least privilege), and the
    mounts merge with those of config/certmanager and the client-auth component."""
    base = render(CONFIG / "certmanager")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    components = ["progress-push", "webhook-client-auth"]
    kustomization = {
        "resources": [os.path.relpath(CONFIG / "certmanager", overlay)],
        "components": [os.path.relpath(CONFIG / "components" / c, overlay) for c in components],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = render(overlay)
    certs, issuers = by_kind(docs, "Certificate"), by_kind(docs, "Issuer")
    ca = certs["kubeckpt-progress-ca"]["spec"]
    assert ca["isCA"] is True and ca["secretName"] == "kubeckpt-progress-ca"
    assert ca["issuerRef"] == {"kind": "Issuer", "name": "kubeckpt-selfsigned"}
    assert issuers["kubeckpt-selfsigned"]["spec"] == {"selfSigned": {}}
    hours = int(ca["duration"].removesuffix("h"))
    assert hours >= 5 * 365 * 24
    assert issuers["kubeckpt-progress-ca"]["spec"] == {"ca": {"secretName": "kubeckpt-progress-ca"}}
    serving = certs["kubeckpt-progress"]["spec"]
    assert serving["issuerRef"] == {"kind": "Issuer", "name": "kubeckpt-progress-ca"}
    assert not serving.get("isCA")
    webhook = by_kind(docs, "Deployment")["kubeckpt-webhook"]["spec"]["template"]["spec"]
    c = webhook["containers"][0]
    assert "--progress-push-ca-file=/etc/kubeckpt/progress-ca/ca.crt" in c["args"]
    assert "--client-ca-file=/etc/kubeckpt/client-ca/ca.crt" in c["args"]
    volumes = {v["name"]: v for v in webhook["volumes"]}
    assert volumes["progress-ca"]["secret"] == {
        "secretName": "kubeckpt-progress-ca",
        "optional": True,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert {"certs", "client-ca", "progress-ca"} == set(volumes)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["progress-ca"] == {
        "name": "progress-ca",
        "mountPath": "/etc/kubeckpt/progress-ca",
        "readOnly": True,
    }
    # Only the reconciler reads the serving key; nothing else mounts the CA's Secret.
    reconciler = by_kind(docs, "Deployment")["kubeckpt-reconciler"]["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in reconciler["volumes"]] == ["kubeckpt-progress-tls"]
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", VAP, BINDING):
        assert by_kind(docs, kind) == by_kind(base, kind), kind
