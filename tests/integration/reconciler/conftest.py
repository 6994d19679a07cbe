"""Fixtures for the reconciler library's tests on the local control plane."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request

from localcluster import LocalCluster
from reconciler.client import Client
from reconciler.errors import ApiError
from reconciler.exec import ExecError, exec_command
from reconciler.resources import PODS
from tests.support.cluster_clients import admin_config as admin_config
from tests.support.cluster_clients import eventually as eventually


async def run_pod(client: Client, namespace: str, name: str) -> None:
    """Create a bare pod (the scheduler binds it to a KWOK node) and wait until it runs."""
    pods = client.api(PODS)
    await pods.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    )

    async def running() -> bool:
        return (await pods.get(name, namespace)).get("status", {}).get("phase") == "Running"

    await eventually(running, f"pod {name} to run", within=60, interval=0.2)


async def wait_exec_ready(client: Client, namespace: str, pod: str) -> None:
    """KWOK learns of a new Exec object through its informer: retry until exec works."""
    async with asyncio.timeout(30):
        while True:
            try:
                r = await exec_command(client, namespace, pod, ["true"], timeout=5)
                if r.exit_code == 0:
                    return
            except (ExecError, ApiError):
                pass
            await asyncio.sleep(0.3)


def etcd_revision(cluster: LocalCluster) -> int:
    body = json.dumps({"key": base64.b64encode(b"/").decode()}).encode()
    req = urllib.request.Request(cluster.etcd_url + "/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(json.loads(r.read())["header"]["revision"])


def compact_etcd(cluster: LocalCluster) -> int:
    """Compact etcd at its current revision: every older resourceVersion is gone (410)."""
    rev = etcd_revision(cluster)
    body = json.dumps({"revision": str(rev), "physical": True}).encode()
    req = urllib.request.Request(cluster.etcd_url + "/v3/kv/compaction", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return rev
