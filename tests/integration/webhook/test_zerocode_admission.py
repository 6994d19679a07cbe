"""Zero-code mode against the real API server: pods with the init container, the read-only runtime
volume and the PYTHONPATH forms are valid Pods (server-side dry run, nothing stored), and the
webhook process adds them when the policy, or the pod's annotation, asks."""

from __future__ import annotations

import copy
import uuid

import pytest
import yaml

from localcluster import LocalCluster
from tests.integration.webhook.conftest import WebhookProcess, dry_run_pod, wait_policy_seen
from tests.support.operator_pods import pytorchjob_owner
from tests.unit.webhook.test_mutation import pod, policy
from webhook.mutation import (
    DEFAULT_RUNTIME_IMAGE,
    RUNTIME_DIR,
    RUNTIME_INIT_CONTAINER,
    USER_PYTHONPATH,
    mutate,
)

NS = {"metadata": {"name": "default", "labels": {"kubeckpt.io/inject": "enabled"}}}


def _variant(kind: str) -> dict:
    p = pod()
    target = p["spec"]["containers"][1]
    if kind == "plain":
        target["env"].append({"name": "PYTHONPATH", "value": "/app"})
    elif kind == "valueFrom":
        ref = {"fieldRef": {"fieldPath": "metadata.name"}}
        target["env"].append({"name": "PYTHONPATH", "valueFrom": ref})
    elif kind == "envFrom":
        target["envFrom"] = [{"configMapRef": {"name": "absent", "optional": True}}]
    elif kind == "user-init":
        p["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "command": ["true"]}]
    return p


@pytest.mark.parametrize("kind", ["none", "plain", "valueFrom", "envFrom", "user-init"])
def test_zero_code_pods_are_accepted_by_the_api_server(cluster: LocalCluster, kind: str) -> None:
    p = _variant(kind)
    # Namespace "default" is not opted in for a webhook: only our patch is applied.
    p["metadata"] = {**p["metadata"], "namespace": "default", "name": f"zc-{uuid.uuid4().hex[:8]}"}
    p["metadata"].pop("generateName", None)
    r = mutate(copy.deepcopy(p), policy(instrumentation={"auto": True}), NS)
    assert r.injected and "instrumentation/auto" not in r.skipped
    proc = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "yaml",
        "-f",
        "-",
        input=yaml.safe_dump(r.pod),
        check=False,
    )
    assert proc.returncode == 0, f"API server rejected the zero-code pod: {proc.stderr}"
    stored = yaml.safe_load(proc.stdout)
    assert stored["spec"]["initContainers"][-1]["name"] == RUNTIME_INIT_CONTAINER
    env = [e["name"] for e in stored["spec"]["containers"][1]["env"]]
    assert env.count("PYTHONPATH") == 1
    assert (USER_PYTHONPATH in env) == (kind == "valueFrom")


def _probe(namespace: str, annotations: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "zc-probe",
            "namespace": namespace,
            "labels": {"training.kubeflow.org/job-name": "zc"},
            "annotations": annotations,
            "ownerReferences": [pytorchjob_owner("zc")],
        },
        "spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]},
    }


def test_the_webhook_adds_zero_code_when_the_policy_or_the_annotation_asks(
    cluster: LocalCluster, namespace: str, webhook: WebhookProcess
) -> None:
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    obj = policy()
    obj["metadata"] = {"name": "zc", "namespace": namespace}
    cluster.apply(obj)
    wait_policy_seen(cluster, namespace, _probe(namespace, {}))
    plain = dry_run_pod(cluster, _probe(namespace, {}))
    assert "initContainers" not in plain["spec"]  # the policy does not ask
    asked = dry_run_pod(cluster, _probe(namespace, {"kubeckpt.io/instrumentation-auto": "true"}))
    [init] = asked["spec"]["initContainers"]
    assert init["name"] == RUNTIME_INIT_CONTAINER and init["image"] == DEFAULT_RUNTIME_IMAGE
    env = {e["name"]: e.get("value") for e in asked["spec"]["containers"][0]["env"]}
    assert env["PYTHONPATH"] == f"{RUNTIME_DIR}/kubeckpt-hook:{RUNTIME_DIR}"
