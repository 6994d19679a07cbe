"""Helpers for the progress controller's tests on the local control plane."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from localcluster import LocalCluster, wait_for
from localcluster.cluster import KWOK_KEEP_RUNNING_ANNOTATION
from progress_controller.controller import ProgressController
from progress_controller.schedule import PollSettings
from reconciler.client import Client
from reconciler.manager import Manager
from tests.support.cluster_clients import admin_config as admin_config
from tests.support.cluster_clients import eventually as eventually

FAST = PollSettings(
    early=1.0,
    recent=1.0,
    stale=1.0,
    early_window=0.0,
    recent_window=5.0,
    jitter=0.1,
    stall_floor=600.0,
)


def progress(step: int, **kw: Any) -> bytes:
    data = {
        "step": step,
        "totalSteps": 100,
        "loss": f"{1.0 / (step + 1):.4f}",
        "percentComplete": f"{step:.1f}",
        "estimatedTimeRemaining": "5m",
        "stepSeconds": "0.01",
        "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    data.update(kw)
    return json.dumps(data).encode()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def pytorchjob(name: str, namespace: str, progress_file: str, workers: int = 0) -> dict:
    template = {
        "metadata": {"labels": {"kubeckpt.io/injected": "true"}},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "busybox",
                    "env": [
                        {"name": "TRAINING_PROGRESS_FILE", "value": progress_file},
                        {"name": "PROGRESS_UPDATE_FREQUENCY", "value": "1"},
                    ],
                }
            ]
        },
    }
    specs: dict[str, Any] = {
        "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
    }
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def start_job(cluster: LocalCluster, namespace: str, name: str, first: bytes) -> Path:
    """A PyTorchJob whose master pod serves `<exec dir>/progress.json` (written first)."""
    d = cluster.exec_dir(namespace, f"{name}-master-0")
    write_atomic(d / "progress.json", first)
    cluster.apply(pytorchjob(name, namespace, str(d / "progress.json")))
    return d / "progress.json"


def get_json(cluster: LocalCluster, resource: str, name: str, namespace: str) -> dict:
    where = ["-n", namespace] if namespace else []
    return json.loads(cluster.kubectl("get", resource, name, *where, "-o", "json").stdout)


def controller_ref(obj: dict) -> dict:
    """The ownerReference a controller puts on what it creates (controller-runtime's
    SetControllerReference): the one the progress controller follows up to the job."""
    md = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def install_jobset_crd(cluster: LocalCluster) -> None:
    """JobSet's CRD from its module (as the Trainer stack installs it), without its controller."""
    assert cluster.binaries is not None
    args = ["apply", "--server-side", "--force-conflicts", "--field-manager=kubeckpt-tests"]
    for f in sorted(cluster.binaries.require_trainer().jobset_manifests.glob("crds/*.yaml")):
        args += ["-f", str(f)]
    cluster.kubectl(*args)

    def established() -> bool:
        crd = get_json(cluster, "crd", "jobsets.jobset.x-k8s.io", "")
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    # Polled: `kubectl wait --for=condition=...` fails at once while the CRD has no conditions.
    wait_for(established, "JobSet's CRD to be Established", timeout=60)


# On a pod a batch Job owns: KWOK keeps it Running, as a training pod runs until stopped.
KWOK_KEEPS_RUNNING = {KWOK_KEEP_RUNNING_ANNOTATION: "true"}


def trainjob_batch_job(cluster: LocalCluster, namespace: str, name: str) -> dict:
    """For the TrainJob `name` (it must exist): the JobSet Trainer makes for it and the batch Job
    JobSet makes for its `node` replicated job, each controlled by the one above with the
    ownerReferences Trainer and JobSet set (seen on the real ones: tests/node runs them), made
    here by hand where no Trainer or JobSet controller runs. The Job is managed by no one
    (`spec.managedBy`): the cluster's Job controller neither makes pods for it nor releases
    the pods the tests make for it (it would, as they do not match its selector). The pods
    carry KWOK_KEEPS_RUNNING (KWOK would complete them at once, as a Job's)."""
    tj = get_json(cluster, "trainjobs.trainer.kubeflow.org", name, namespace)
    cluster.apply(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [controller_ref(tj)],
            },
            "spec": {},
        }
    )
    jobset = get_json(cluster, "jobsets.jobset.x-k8s.io", name, namespace)
    job_name = f"{name}-node-0"
    cluster.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name,
                "namespace": namespace,
                "labels": {"jobset.sigs.k8s.io/jobset-name": name},
                "ownerReferences": [controller_ref(jobset)],
            },
            "spec": {
                "managedBy": "kubeckpt.io/tests",
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "node", "image": "busybox"}],
                    }
                },
            },
        }
    )
    return get_json(cluster, "jobs.batch", job_name, namespace)


@contextlib.asynccontextmanager
async def running_controller(
    client: Client, settings: PollSettings = FAST, **kw: Any
) -> AsyncIterator[ProgressController]:
    manager = Manager(client, name="progress-test", port=None, drain_timeout=1.0)
    ctrl = ProgressController(manager, settings=settings, **kw)
    task = asyncio.create_task(manager.run())
    try:
        await eventually(lambda: manager.is_leader, "the controller to start", within=30)
        yield ctrl
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)


async def get_tp(client: Client, namespace: str, name: str) -> dict | None:
    from progress_controller.controller import TRAININGPROGRESSES
    from reconciler.errors import NotFound

    try:
        return await client.api(TRAININGPROGRESSES).get(name, namespace)
    except NotFound:
        return None


def cond(tp: dict, type_: str) -> dict:
    return next(
        (c for c in (tp.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


def job_events(
    cluster: LocalCluster, namespace: str, name: str, kind: str = "PyTorchJob"
) -> list[dict]:
    out = cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "-o",
        "json",
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind={kind}",
    ).stdout
    return json.loads(out)["items"]


def event_counts(
    cluster: LocalCluster, namespace: str, name: str, kind: str = "PyTorchJob"
) -> dict[str, int]:
    """Events on the job by reason, aggregated ones counted as often as they happened."""
    out: dict[str, int] = {}
    for e in job_events(cluster, namespace, name, kind):
        out[e["reason"]] = out.get(e["reason"], 0) + int(e.get("count") or 1)
    return out


def record_writes(ctrl: ProgressController, ns: str) -> list[tuple[str, dict, dict]]:
    """(key, stored status, written status) of every status write the controller makes in ns.

    Only ns: an earlier test's namespace, deleted without waiting, can still hold jobs whose
    pods go first, and the controller rightly writes PodNotFound for them (seen in CI).
    """
    out: list[tuple[str, dict, dict]] = []
    write = ctrl._write

    async def recording(key: str, job: dict, tp: dict, prev: dict, dec: Any) -> None:
        n = ctrl.stats["writes"]
        await write(key, job, tp, prev, dec)
        if ctrl.stats["writes"] > n and key.startswith(f"{ns}/"):
            out.append((key, prev, dec.status))

    ctrl._write = recording  # type: ignore[method-assign]
    return out
