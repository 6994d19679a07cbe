"""A JAX training pod gets exactly the injection a torch pod gets (issue 14, item 3).

The pods are built as Kubeflow Trainer v2 and JobSet create them for a TrainJob on the
`jax-distributed` runtime (Trainer's JAX plugin sets JAX_NUM_PROCESSES, JAX_PROCESS_ID from the
completion index, JAX_COORDINATOR_ADDRESS/PORT and JAX_DISTRIBUTED_BACKEND on the `node` container)
and on `torch-distributed` (PET_* for torchrun). The two differ only in the user's container, so
everything the mutation adds is compared between them, field by field, rather than re-listed here.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from webhook.mutation import STATUS_ANNOTATION, mutate

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
PLAIN_NS = {"metadata": {"name": "team-a"}}
JOB = "tj"
NODES = 4
JAX_PORT = 6666


def policy(**spec: object) -> dict:
    base: dict = {"storage": {"uri": "pvc://ckpt/runs"}}
    base.update(spec)
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {
            "name": "p1",
            "namespace": "team-a",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": base,
    }


def completion_index_env(name: str) -> dict:
    path = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def jax_container() -> dict:
    """The `node` container as Trainer's JAX plugin leaves it."""
    return {
        "name": "node",
        "image": "nvcr.io/nvidia/jax:25.10-py3",
        "command": ["python", "-m", "train_jax"],
        "env": [
            {"name": "JAX_NUM_PROCESSES", "value": str(NODES)},
            completion_index_env("JAX_PROCESS_ID"),
            {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{JOB}-node-0-0.{JOB}:{JAX_PORT}"},
            {"name": "JAX_COORDINATOR_PORT", "value": str(JAX_PORT)},
            {"name": "JAX_DISTRIBUTED_BACKEND", "value": "gloo"},
        ],
        "ports": [{"containerPort": JAX_PORT, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }


def torch_container() -> dict:
    """The `node` container as Trainer's torch plugin leaves it."""
    return {
        "name": "node",
        "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
        "command": ["torchrun", "train.py"],
        "env": [
            {"name": "PET_NNODES", "value": str(NODES)},
            {"name": "PET_NPROC_PER_NODE", "value": "8"},
            completion_index_env("PET_NODE_RANK"),
            {"name": "PET_MASTER_ADDR", "value": f"{JOB}-node-0-0.{JOB}"},
            {"name": "PET_MASTER_PORT", "value": "29500"},
        ],
        "ports": [{"containerPort": 29500, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }


def jobset_pod(container: dict, index: int = 0, **labels: str) -> dict:
    """A pod as the Job controller creates it for JobSet's `node` replicated job of a TrainJob."""
    job_name = f"{JOB}-node-0"
    jobset = {
        "jobset.sigs.k8s.io/jobset-name": JOB,
        "jobset.sigs.k8s.io/jobset-uid": "0b7f3c1e-1111-4222-8333-944455556666",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/job-key": "5e7c2cbd1e0a3b4f0c6a2f1c9f1e8d7b6a5c4d3e",
        "jobset.sigs.k8s.io/restart-attempt": "0",
    }
    batch = {
        "batch.kubernetes.io/controller-uid": "7c1e2d3f-aaaa-4bbb-8ccc-ddddeeeeffff",
        "batch.kubernetes.io/job-name": job_name,
        "batch.kubernetes.io/job-completion-index": str(index),
        "controller-uid": "7c1e2d3f-aaaa-4bbb-8ccc-ddddeeeeffff",
        "job-name": job_name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{job_name}-{index}-",
            "namespace": "team-a",
            "labels": {
                **jobset,
                **batch,
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
                **labels,
            },
            "annotations": {
                **jobset,
                "batch.kubernetes.io/job-completion-index": str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": "7c1e2d3f-aaaa-4bbb-8ccc-ddddeeeeffff",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "hostname": f"{job_name}-{index}",
            "subdomain": JOB,
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 30,
            "containers": [copy.deepcopy(container)],
        },
    }


def plain_pod(container: dict, **labels: str) -> dict:
    """A pod no operator made: no job labels at all."""
    c = {**copy.deepcopy(container), "name": "train"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team-a", "labels": dict(labels)},
        "spec": {"containers": [c]},
    }


def target(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "node")


def injection(result: Any, original: dict) -> dict[str, Any]:
    """Everything the mutation added or decided, with the user's own container fields left out."""
    before, after = target(original), target(result.pod)
    user_env = before.get("env") or []
    assert after["env"][: len(user_env)] == user_env, "the user's env is kept, first, as it was"
    labels_before = original["metadata"].get("labels") or {}
    annotations_before = original["metadata"].get("annotations") or {}
    meta = result.pod["metadata"]
    return {
        "reason": result.reason,
        "warnings": result.warnings,
        "skipped": result.skipped,
        "env": after["env"][len(user_env) :],
        "volumes": result.pod["spec"].get("volumes"),
        "volumeMounts": after.get("volumeMounts"),
        "lifecycle": after.get("lifecycle"),
        "terminationGracePeriodSeconds": result.pod["spec"].get("terminationGracePeriodSeconds"),
        "initContainers": result.pod["spec"].get("initContainers"),
        "labels": {k: v for k, v in meta["labels"].items() if k not in labels_before},
        "annotations": {
            k: v for k, v in meta["annotations"].items() if k not in annotations_before
        },
    }


MEASURED = {"status": {"stepSeconds": "2", "checkpointing": {"lastSaveSeconds": "20"}}}
POLICIES = {
    "defaults": (policy(), None),
    "s3-steps": (
        policy(
            storage={"uri": "s3://bucket/prefix", "secretRef": {"name": "s3"}},
            strategy="steps",
            saveSteps=500,
        ),
        None,
    ),
    "local-tier-sized-by-model": (
        policy(localTier={"enabled": True, "modelParameters": 7_000_000_000, "periodSteps": 50}),
        None,
    ),
    "measured-grace": (policy(jit={"enabled": True, "maxGracePeriodSeconds": 600}), MEASURED),
    "jit-off": (policy(jit={"enabled": False}), None),
    "zero-code": (policy(instrumentation={"auto": True}), None),
}


@pytest.mark.parametrize("index", [0, 3], ids=["rank0", "rank3"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_jobset_jax_pod_gets_the_torch_pods_injection(name: str, index: int) -> None:
    pol, progress = POLICIES[name]
    jax_pod, torch_pod = jobset_pod(jax_container(), index), jobset_pod(torch_container(), index)
    jax = mutate(jax_pod, pol, NS, progress)
    torch = mutate(torch_pod, pol, NS, progress)
    assert torch.injected and jax.injected
    assert injection(jax, jax_pod) == injection(torch, torch_pod)
    # The same ops, in the same order, at the same paths: the API server stores the same fields.
    assert jax.patch == torch.patch
    assert jsonpatch.apply_patch(jax_pod, jax.patch) == jax.pod
    status = json.loads(jax.pod["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["container"] == "node"


def test_jax_pods_own_fields_are_untouched() -> None:
    """Command, image, ports, resources and every JAX variable stay as Trainer set them."""
    original = jobset_pod(jax_container())
    r = mutate(original, policy(localTier={"enabled": True}), NS, MEASURED)
    before, after = target(original), target(r.pod)
    for key in set(before) - {"env"}:
        assert after[key] == before[key], key
    assert after["env"][: len(before["env"])] == before["env"]
    added = {e["name"] for e in after["env"][len(before["env"]) :]}
    # Nothing we add is read by JAX or XLA, or steers a torch launcher the pod does not run.
    assert not {n for n in added if n.startswith(("JAX_", "XLA_", "PET_", "MASTER_"))}
    # The pod-level fields the JobSet/Job controllers set are kept (hostname/subdomain make the
    # coordinator address resolvable; the owner reference ties the pod to its Job).
    for key in ("hostname", "subdomain", "restartPolicy"):
        assert r.pod["spec"][key] == original["spec"][key]
    assert r.pod["metadata"]["ownerReferences"] == original["metadata"]["ownerReferences"]
    for k, v in original["metadata"]["labels"].items():
        assert r.pod["metadata"]["labels"][k] == v


def test_jax_pod_gets_the_stop_budget_the_runtime_core_reads() -> None:
    """TORCH_ELASTIC_SHUTDOWN_TIMEOUT is torch-named, but the framework-neutral runtime reads it
    as its stop budget (trainer_runtime/stop/jit.py `_stop_budget`, handover, kubeckpt-prestop):
    a JAX pod must get it too, equal to what the preStop hook waits."""
    r = mutate(jobset_pod(jax_container()), policy(), NS)
    env = {e["name"]: e for e in target(r.pod)["env"]}
    budget = int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"])
    script = target(r.pod)["lifecycle"]["preStop"]["exec"]["command"][2]
    assert f"kubeckpt-prestop --timeout {budget};" in script
    assert 0 < budget < r.pod["spec"]["terminationGracePeriodSeconds"]


def test_local_tier_size_counts_jax_processes_as_nodes() -> None:
    """Trainer's JAX plugin runs one JAX process per node and says how many in JAX_NUM_PROCESSES
    (there is no PET_NNODES): the ramdisk is sized per node as for the torch pod."""
    pol = policy(localTier={"enabled": True, "modelParameters": 7_000_000_000})

    def size(container: dict) -> str:
        vols = {v["name"]: v for v in mutate(jobset_pod(container), pol, NS).pod["spec"]["volumes"]}
        return vols["kubeckpt-local"]["emptyDir"]["sizeLimit"]

    one = jax_container()
    one["env"][0]["value"] = "1"
    assert size(jax_container()) == size(torch_container()) == "46063Mi"  # 7e9 x 12 B / 4 nodes
    assert size(one) == "184250Mi"


@pytest.mark.parametrize(
    ("labels", "ns", "expect"),
    [
        ({}, NS, True),
        ({}, PLAIN_NS, False),
        ({"kubeckpt.io/inject": "true"}, PLAIN_NS, True),
        ({"kubeckpt.io/inject": "false"}, NS, False),
    ],
    ids=["namespace-opt-in", "not-opted-in", "pod-label-opt-in", "pod-label-opt-out"],
)
def test_opt_in_decides_for_jax_as_for_torch(labels: dict, ns: dict, expect: bool) -> None:
    jax_pod = jobset_pod(jax_container(), **labels)
    torch_pod = jobset_pod(torch_container(), **labels)
    jax, torch = mutate(jax_pod, policy(), ns), mutate(torch_pod, policy(), ns)
    assert jax.injected is torch.injected is expect
    assert injection(jax, jax_pod) == injection(torch, torch_pod)
    assert jax.patch == torch.patch
    if not expect:
        assert jax.patch == [] and jax.pod == jax_pod


@pytest.mark.parametrize("ns", [NS, PLAIN_NS], ids=["opted-in-namespace", "plain-namespace"])
def test_plain_opted_in_jax_pod_is_treated_as_a_plain_torch_pod(ns: dict) -> None:
    """Without a job's labels there is no job (no KUBECKPT_JOB_*, no per-job CHECKPOINT_URI, no
    TrainingProgress owner): DESIGN.md "Pods" injects training pods only, the opt-in label alone
    does not make one. A JAX pod is passed exactly as a torch pod is."""
    jax_pod = plain_pod(jax_container(), **{"kubeckpt.io/inject": "true"})
    torch_pod = plain_pod(torch_container(), **{"kubeckpt.io/inject": "true"})
    jax, torch = mutate(jax_pod, policy(), ns), mutate(torch_pod, policy(), ns)
    assert (jax.injected, jax.reason, jax.patch) == (torch.injected, torch.reason, torch.patch)
    assert (jax.reason, jax.patch, jax.pod) == ("not a training pod", [], jax_pod)


def test_jax_pod_reinvocation_changes_nothing() -> None:
    r1 = mutate(jobset_pod(jax_container()), policy(localTier={"enabled": True}), NS)
    r2 = mutate(r1.pod, policy(localTier={"enabled": True}), NS)
    assert r2.patch == [] and r2.pod == r1.pod and r2.reason == "already injected"
