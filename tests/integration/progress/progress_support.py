"""Helpers for the progress controller's tests on the local control plane."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from localcluster import LocalCluster
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
