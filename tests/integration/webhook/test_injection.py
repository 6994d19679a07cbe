"""The webhook on the real control plane: the training-operator's pods come out injected."""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster import LocalCluster, wait_for
from reconciler.pki import make_ca
from tests.integration.webhook.conftest import (
    WEBHOOK_NS,
    WebhookProcess,
    dry_run_pod,
    wait_policy_seen,
)
from tests.support.operator_pods import batch_job_owner, pytorchjob_owner
from tests.support.pod_strategies import policies, progress, training_pods
from webhook.mutation import mutate

REPO = Path(__file__).resolve().parents[3]
POLICY = {
    "apiVersion": "kubeckpt.io/v1alpha1",
    "kind": "CheckpointPolicy",
    "metadata": {"name": "team-default"},
    "spec": {"storage": {"uri": "pvc://ckpt/runs"}, "jit": {"maxGracePeriodSeconds": 240}},
}
PUSH_CA = make_ca(
    "kubeckpt-progress-ca",
    now=datetime.now(UTC),
    validity=timedelta(days=1),
    backdate=timedelta(minutes=5),
).cert_pem.decode()
TORCHRUN = (
    "pip list | grep torch; torchrun --nnodes=$PET_NNODES --nproc-per-node=1 "
    "--node-rank=$PET_NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py"
)


def pytorchjob(name: str, namespace: str, labels: dict | None = None) -> dict:
    template = {
        "metadata": {"labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "example.com/team/trainer:1",
                    "command": ["bash", "-c", TORCHRUN],
                }
            ]
        },
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
            }
        },
    }


def probe_pod(namespace: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": {"training.kubeflow.org/job-name": "probe", **labels},
            # as the operator creates it (a dry run: the owner need not exist)
            "ownerReferences": [pytorchjob_owner("probe")],
        },
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    }


def trainjob_node_pod(namespace: str, name: str, container: dict) -> dict:
    """A pod as JobSet's Job creates it for the `node` replicated job of TrainJob `tj`."""
    index = {"batch.kubernetes.io/job-completion-index": "0"}
    jobset = {
        "jobset.sigs.k8s.io/jobset-name": "tj",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **jobset,
                **index,
                "batch.kubernetes.io/job-name": "tj-node-0",
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            },
            "annotations": {**jobset, **index},
            "ownerReferences": [batch_job_owner("tj")],  # JobSet's Job tj-node-0
        },
        "spec": {"hostname": "tj-node-0-0", "subdomain": "tj", "containers": [container]},
    }


def node_container(command: list[str], env: list[tuple[str, str]], port: int) -> dict:
    """The `node` container as Trainer's JAX or torch plugin leaves it."""
    rank = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return {
        "name": "node",
        "image": "example.com/team/trainer:1",
        "command": command,
        "env": [
            {"name": n, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": rank}}}
            if v == "RANK"
            else {"name": n, "value": v}
            for n, v in env
        ],
        "ports": [{"containerPort": port, "protocol": "TCP"}],
    }


JAX_NODE = node_container(
    ["python", "-m", "train_jax"],
    [
        ("JAX_NUM_PROCESSES", "2"),
        ("JAX_PROCESS_ID", "RANK"),
        ("JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:6666"),
        ("JAX_COORDINATOR_PORT", "6666"),
        ("JAX_DISTRIBUTED_BACKEND", "gloo"),
    ],
    6666,
)
TORCH_NODE = node_container(
    ["torchrun", "train.py"],
    [
        ("PET_NNODES", "2"),
        ("PET_NPROC_PER_NODE", "1"),
        ("PET_NODE_RANK", "RANK"),
        ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
        ("PET_MASTER_PORT", "29500"),
    ],
    29500,
)


def injected_fields(pod: dict, user: dict) -> dict:
    """What admission added to a `node` pod beyond the user's container, without the API
    server's own service-account token volume (its name is random)."""
    c = pod["spec"]["containers"][0]
    assert c["env"][: len(user["env"])] == user["env"], "the user's env is kept as it was"

    def ours(items: list[dict]) -> list[dict]:
        return [i for i in items if not i["name"].startswith("kube-api-access")]

    return {
        "env": c["env"][len(user["env"]) :],
        "volumes": ours(pod["spec"]["volumes"]),
        "volumeMounts": ours(c["volumeMounts"]),
        "lifecycle": c.get("lifecycle"),
        "terminationGracePeriodSeconds": pod["spec"]["terminationGracePeriodSeconds"],
        "injected": pod["metadata"]["labels"].get("kubeckpt.io/injected"),
        "status": json.loads(pod["metadata"]["annotations"]["kubeckpt.io/status"]),
    }


def job_pods(cluster: LocalCluster, namespace: str, job: str) -> list[dict]:
    out = cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={job}", "-o", "json"
    ).stdout
    return json.loads(out)["items"]


def two_pods(cluster: LocalCluster, namespace: str, job: str) -> list[dict] | None:
    pods = job_pods(cluster, namespace, job)
    return pods if len(pods) == 2 else None


def env(pod: dict) -> dict[str, dict]:
    c = next(c for c in pod["spec"]["containers"] if c["name"] == "pytorch")
    return {e["name"]: e for e in c.get("env", [])}


@pytest.fixture
def opted_in(cluster: LocalCluster, namespace: str, webhook: WebhookProcess) -> str:
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    cluster.apply({**POLICY, "metadata": {**POLICY["metadata"], "namespace": namespace}})
    wait_policy_seen(cluster, namespace, probe_pod(namespace))
    return namespace


def test_pytorchjob_pods_are_injected_master_and_worker(
    cluster: LocalCluster, opted_in: str
) -> None:
    ns = opted_in
    cluster.apply(pytorchjob("llm", ns))
    pods = wait_for(
        lambda: two_pods(cluster, ns, "llm"),
        "the operator's two pods",
        timeout=60,
    )
    for pod in pods:
        role = pod["metadata"]["labels"]["training.kubeflow.org/replica-type"]
        assert pod["metadata"]["labels"]["kubeckpt.io/injected"] == "true", role
        status = json.loads(pod["metadata"]["annotations"]["kubeckpt.io/status"])
        assert status["policy"] == "team-default" and status["container"] == "pytorch"
        e = env(pod)
        assert e["CHECKPOINT_URI"]["value"] == f"/mnt/kubeckpt/{ns}/llm"
        assert e["KUBECKPT_JOB_NAME"]["value"] == "llm"
        assert e["KUBECKPT_JOB_KIND"]["value"] == "PyTorchJob"
        assert e["TRAINING_PROGRESS_FILE"]["value"] == "/var/run/kubeckpt/progress.json"
        # The operator's own env is still there beside ours.
        assert "MASTER_ADDR" in e and "WORLD_SIZE" in e
        assert pod["spec"]["terminationGracePeriodSeconds"] == 240
        c = pod["spec"]["containers"][0]
        assert c["command"] == ["bash", "-c", TORCHRUN], "the user's command is untouched"
        assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "/bin/sh"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["kubeckpt-storage"]["subPath"] == f"runs/{ns}/llm"
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vols["kubeckpt-storage"]["persistentVolumeClaim"]["claimName"] == "ckpt"
        # The API server's own injection (the service-account token volume) coexists with ours.
        assert any(v["name"].startswith("kube-api-access") for v in pod["spec"]["volumes"])


def test_jax_trainjob_pod_is_injected_as_the_torch_one(
    cluster: LocalCluster, opted_in: str
) -> None:
    """Issue 14: a JAX TrainJob's node pod gets, through the API server and the webhook, exactly
    what the same TrainJob's torch pod gets; JAX's own fields pass through."""
    jax = dry_run_pod(cluster, trainjob_node_pod(opted_in, "tj-node-0-0-jax", JAX_NODE))
    torch = dry_run_pod(cluster, trainjob_node_pod(opted_in, "tj-node-0-0-torch", TORCH_NODE))
    got = injected_fields(jax, JAX_NODE)
    assert got == injected_fields(torch, TORCH_NODE)
    assert got["injected"] == "true" and got["status"]["container"] == "node"
    e = {x["name"]: x for x in got["env"]}
    assert e["KUBECKPT_JOB_KIND"]["value"] == "TrainJob" and e["KUBECKPT_JOB_NAME"]["value"] == "tj"
    # A TrainJob's own directory: a PyTorchJob named tj keeps /mnt/kubeckpt/<ns>/tj.
    assert e["CHECKPOINT_URI"]["value"] == f"/mnt/kubeckpt/{opted_in}/_trainjob/tj"
    assert got["terminationGracePeriodSeconds"] == 240
    c = jax["spec"]["containers"][0]
    assert (c["command"], c["ports"]) == (JAX_NODE["command"], JAX_NODE["ports"])
    assert (jax["spec"]["hostname"], jax["spec"]["subdomain"]) == ("tj-node-0-0", "tj")


def test_user_set_checkpoint_uri_survives(cluster: LocalCluster, opted_in: str) -> None:
    job = pytorchjob("mine", opted_in)
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["env"] = [
            {"name": "CHECKPOINT_URI", "value": "s3://my-bucket/custom"}
        ]
    cluster.apply(job)
    pods = wait_for(
        lambda: two_pods(cluster, opted_in, "mine"),
        "the pods",
        timeout=60,
    )
    for pod in pods:
        assert env(pod)["CHECKPOINT_URI"]["value"] == "s3://my-bucket/custom"
        status = json.loads(pod["metadata"]["annotations"]["kubeckpt.io/status"])
        assert "env/CHECKPOINT_URI" in status["skipped"]


def test_opt_out_label_wins(cluster: LocalCluster, opted_in: str) -> None:
    got = dry_run_pod(cluster, probe_pod(opted_in, **{"kubeckpt.io/inject": "false"}))
    assert "kubeckpt.io/injected" not in got["metadata"]["labels"]
    assert "env" not in got["spec"]["containers"][0]


def test_unlabelled_namespace_needs_the_pod_opt_in_label(
    cluster: LocalCluster, namespace: str, webhook: WebhookProcess
) -> None:
    cluster.apply({**POLICY, "metadata": {**POLICY["metadata"], "namespace": namespace}})
    # The opt-in pod proves the policy reached the cache; the plain pod is then never touched.
    wait_policy_seen(cluster, namespace, probe_pod(namespace, **{"kubeckpt.io/inject": "true"}))
    plain = dry_run_pod(cluster, probe_pod(namespace))
    assert "kubeckpt.io/injected" not in plain["metadata"].get("labels", {})
    assert "env" not in plain["spec"]["containers"][0]


def test_invalid_override_warns_and_still_admits(cluster: LocalCluster, opted_in: str) -> None:
    pod = probe_pod(opted_in)
    pod["metadata"]["annotations"] = {"kubeckpt.io/max-checkpoints": "many"}
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod)
    )
    got = json.loads(proc.stdout)
    assert got["metadata"]["labels"]["kubeckpt.io/injected"] == "true"
    assert "kubeckpt.io/max-checkpoints" in proc.stderr  # the admission warning reaches kubectl


def test_a_label_forged_master_is_not_injected(cluster: LocalCluster, opted_in: str) -> None:
    """A bare pod that carries a PyTorchJob master's labels, but that no PyTorchJob controls, is
    admitted as it came, and kubectl prints why."""
    forged = probe_pod(opted_in, **{"training.kubeflow.org/job-role": "master"})
    del forged["metadata"]["ownerReferences"]
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(forged)
    )
    got = json.loads(proc.stdout)
    assert "kubeckpt.io/injected" not in got["metadata"]["labels"]
    assert "env" not in got["spec"]["containers"][0] and "kubeckpt.io/status" not in (
        got["metadata"].get("annotations") or {}
    )
    assert "not injected as a pod of PyTorchJob probe" in proc.stderr


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(pod=training_pods(), pol=policies(), tp=progress, push_ca=st.sampled_from([None, PUSH_CA]))
def test_patched_pods_are_accepted_by_the_api_server(
    cluster: LocalCluster, pod: dict, pol: dict, tp: dict, push_ca: str | None
) -> None:
    """Property: whatever the user's pod, the pod we produce is a valid Pod for the API server
    (with the progress push CA from the webhook's annotation or from the ConfigMap)."""
    ns_obj = {"metadata": {"name": "default", "labels": {"kubeckpt.io/inject": "enabled"}}}
    pod["metadata"]["namespace"] = "default"  # unlabelled for the webhook: only our patch applies
    pod["metadata"]["name"] = "prop-" + uuid.uuid4().hex[:8]
    patched = mutate(pod, pol, ns_obj, tp, push_ca=push_ca).pod
    proc = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=yaml.safe_dump(patched),
        check=False,
    )
    assert proc.returncode == 0, f"API server rejected the patched pod: {proc.stderr}"


def test_fail_open_when_the_webhook_is_down(
    cluster: LocalCluster, opted_in: str, webhook: WebhookProcess
) -> None:
    webhook.stop()
    try:
        cluster.apply(pytorchjob("nohook", opted_in))
        pods = wait_for(
            lambda: two_pods(cluster, opted_in, "nohook"),
            "the pods, created without the webhook",
            timeout=60,
        )
        for pod in pods:
            assert "kubeckpt.io/injected" not in pod["metadata"]["labels"]
            assert "CHECKPOINT_URI" not in env(pod)
    finally:
        webhook.start()


def _requests_answered(cluster: LocalCluster, webhook: WebhookProcess) -> float:
    """kubeckpt_webhook_requests_total summed over results, scraped as a bound Prometheus."""
    cluster.apply((REPO / "config" / "rbac" / "metrics_reader_role.yaml").read_text())
    cluster.kubectl("create", "serviceaccount", "prom", "-n", WEBHOOK_NS, check=False)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        "prom-kubeckpt-metrics",
        "--clusterrole=kubeckpt-metrics-reader",
        f"--serviceaccount={WEBHOOK_NS}:prom",
        check=False,
    )
    token = cluster.kubectl("create", "token", "prom", "-n", WEBHOOK_NS).stdout.strip()
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(webhook.url + "/metrics")
    req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kubeckpt_webhook_requests_total{")
    )


def test_only_training_pods_reach_the_webhook(
    cluster: LocalCluster, opted_in: str, webhook: WebhookProcess
) -> None:
    """matchConditions: the API server calls the webhook for a training job's pod only; a web
    server, a pod of an initializer step, a pod with an empty job label are admitted without a
    call (their creation no longer waits on, or depends on, the webhook)."""
    others = [
        {"app": "web"},
        {"training.kubeflow.org/job-name": ""},
        {"training.kubeflow.org/job-name": "j", "training.kubeflow.org/operator-name": "tfjob"},
        {"jobset.sigs.k8s.io/jobset-name": "tj", "jobset.sigs.k8s.io/replicatedjob-name": "init"},
    ]
    before = _requests_answered(cluster, webhook)
    for labels in others:
        pod = probe_pod(opted_in)
        pod["metadata"]["labels"] = labels
        got = dry_run_pod(cluster, pod)
        assert "kubeckpt.io/injected" not in got["metadata"].get("labels", {}), labels
    assert _requests_answered(cluster, webhook) == before
    no_labels = probe_pod(opted_in)
    del no_labels["metadata"]["labels"]
    dry_run_pod(cluster, no_labels)
    assert _requests_answered(cluster, webhook) == before
    # The kinds the webhook recognises still reach it, each with exactly one call.
    got = dry_run_pod(cluster, probe_pod(opted_in))
    assert got["metadata"]["labels"]["kubeckpt.io/injected"] == "true"
    jobset = probe_pod(opted_in)
    jobset["metadata"]["labels"] = {
        "jobset.sigs.k8s.io/jobset-name": "tj",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    jobset["metadata"]["ownerReferences"] = [batch_job_owner("tj")]
    jobset["spec"]["containers"][0]["name"] = "node"
    got = dry_run_pod(cluster, jobset)
    assert got["metadata"]["labels"]["kubeckpt.io/injected"] == "true"
    assert _requests_answered(cluster, webhook) == before + 2
