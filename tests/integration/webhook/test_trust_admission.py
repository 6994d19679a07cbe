"""What the webhook decides from what tenants and training pods control, on the real API server
(issue 24): a per-job annotation cannot raise the policy's limits; a TrainingProgress with hostile
numbers does not keep the job's next pod from being injected; each pod's grace period is sized
from its own job's TrainingProgress (by spec.jobRef and ownership); same-named PyTorchJob and
TrainJob get separate checkpoint directories."""

from __future__ import annotations

import json

import pytest

from localcluster import LocalCluster, wait_for
from tests.integration.webhook.conftest import WebhookProcess, wait_policy_seen
from tests.support.operator_pods import operator_pod, training_progress

CAP = 120


@pytest.fixture
def capped(cluster: LocalCluster, namespace: str, webhook: WebhookProcess) -> str:
    """An opted-in namespace whose policy caps the grace period at 120 s."""
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    cluster.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": "capped", "namespace": namespace},
            "spec": {
                "storage": {"uri": "pvc://ckpt/runs"},
                "jit": {"maxGracePeriodSeconds": CAP},
            },
        }
    )
    wait_policy_seen(cluster, namespace, operator_pod("PyTorchJob", "probe", namespace))
    return namespace


def create(cluster: LocalCluster, pod: dict) -> tuple[dict, str]:
    """A server-side dry run of `pod`: (the pod as admission left it, kubectl's stderr)."""
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod)
    )
    return json.loads(proc.stdout), proc.stderr


def test_an_annotation_above_the_policys_cap_is_clamped(cluster: LocalCluster, capped: str) -> None:
    pod = operator_pod("PyTorchJob", "llama", capped)
    pod["metadata"]["annotations"] = {"kubeckpt.io/max-grace-period-seconds": "86400"}
    got, stderr = create(cluster, pod)
    assert got["spec"]["terminationGracePeriodSeconds"] == CAP
    status = json.loads(got["metadata"]["annotations"]["kubeckpt.io/status"])
    assert status["skipped"] == ["override/max-grace-period-seconds"]
    assert "kubeckpt.io/max-grace-period-seconds=86400 is above CheckpointPolicy capped" in stderr
    pod["metadata"]["annotations"] = {"kubeckpt.io/max-grace-period-seconds": "60"}
    got, stderr = create(cluster, pod)
    assert got["spec"]["terminationGracePeriodSeconds"] == 60 and "kubeckpt" not in stderr


def suspended_pytorchjob(cluster: LocalCluster, namespace: str, name: str) -> str:
    """A PyTorchJob its operator creates no pods for; its UID (what its pods' owner names)."""
    cluster.apply(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "runPolicy": {"suspend": True},
                "pytorchReplicaSpecs": {
                    "Master": {
                        "replicas": 1,
                        "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}},
                    }
                },
            },
        }
    )
    return cluster.kubectl(
        "get", "pytorchjob", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()


def set_status(cluster: LocalCluster, namespace: str, name: str, step: str, save: str) -> None:
    status = {"stepSeconds": step, "checkpointing": {"lastSaveSeconds": save}}
    cluster.kubectl(
        "patch", "trainingprogress", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip


def grace_of(cluster: LocalCluster, pod: dict) -> int:
    return create(cluster, pod)[0]["spec"]["terminationGracePeriodSeconds"]


def test_each_job_is_sized_by_its_own_record_and_hostile_numbers_are_ignored(
    cluster: LocalCluster, capped: str
) -> None:
    ns = capped
    uid = suspended_pytorchjob(cluster, ns, "llama")
    pt_pod = operator_pod("PyTorchJob", "llama", ns)
    pt_pod["metadata"]["ownerReferences"][0]["uid"] = uid
    tj_pod = operator_pod("TrainJob", "llama", ns)
    # The TrainJob's record holds the plain name; the PyTorchJob's is the second one.
    # (no TrainJob CRD here to own its record: a TrainJob's pods do not name its UID anyway)
    cluster.apply(
        [
            training_progress("llama", ns, "TrainJob", "llama", None),
            training_progress("llama-pytorchjob", ns, "PyTorchJob", "llama", uid),
        ]
    )
    # huge numbers, as a training pod could report them: ignored, the policy's cap applies
    set_status(cluster, ns, "llama-pytorchjob", "1e308", "1e308")
    set_status(cluster, ns, "llama", "0", "40")  # the TrainJob's: 40 x 1.5 + 10 = 70
    wait_for(lambda: grace_of(cluster, tj_pod) == 70, "the TrainJob's record in the cache", 20)
    got, stderr = create(cluster, pt_pod)
    assert got["metadata"]["labels"]["kubeckpt.io/injected"] == "true", stderr
    assert got["spec"]["terminationGracePeriodSeconds"] == CAP
    # a sound record of the PyTorchJob's sizes its pods, not the TrainJob's
    set_status(cluster, ns, "llama-pytorchjob", "2", "20")  # (20 + 2) x 1.5 + 10 = 43
    wait_for(lambda: grace_of(cluster, pt_pod) == 43, "the PyTorchJob's new record", 20)
    assert grace_of(cluster, tj_pod) == 70
    # and the two jobs never share a checkpoint directory
    mounts = [
        next(m for m in create(cluster, p)[0]["spec"]["containers"][0]["volumeMounts"]
             if m["name"] == "kubeckpt-storage")
        for p in (pt_pod, tj_pod)
    ]  # fmt: skip
    assert [m["subPath"] for m in mounts] == [f"runs/{ns}/llama", f"runs/{ns}/_trainjob/llama"]
