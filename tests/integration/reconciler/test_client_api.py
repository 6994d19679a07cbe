"""The client against the real API server: typed errors from real responses (404, 409, 403, 410),
bearer tokens re-read on rotation, in-cluster configuration, discovery of a CRD, and paginated
lists that restart when etcd compaction expires their continue token."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from conftest import admin_config, compact_etcd

from localcluster import LocalCluster
from reconciler.auth import FileToken
from reconciler.client import Client
from reconciler.config import ClientConfig, load_incluster
from reconciler.errors import AlreadyExists, Conflict, Forbidden, Gone, NotFound, ResourceNotFound
from reconciler.resources import CONFIGMAPS, ResourceClient


def cm(name: str, ns: str, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


async def test_typed_errors_404_409(client: Client, namespace: str) -> None:
    cms = client.api(CONFIGMAPS)
    with pytest.raises(NotFound) as nf:
        await cms.get("missing", namespace)
    assert nf.value.status == 404 and nf.value.reason == "NotFound"
    first = await cms.create(cm("x", namespace, a="1"))
    with pytest.raises(AlreadyExists):
        await cms.create(cm("x", namespace))
    await cms.patch("x", {"data": {"a": "2"}}, namespace)
    with pytest.raises(Conflict) as conflict:
        await cms.replace(first)  # carries the old resourceVersion
    assert type(conflict.value) is Conflict and conflict.value.status == 409


async def test_forbidden_for_a_service_account_without_rbac(
    cluster: LocalCluster, client: Client, namespace: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(cluster.kubectl, "create", "serviceaccount", "nobody", "-n", namespace)
    token = (
        await asyncio.to_thread(cluster.kubectl, "create", "token", "nobody", "-n", namespace)
    ).stdout.strip()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    cfg = ClientConfig(
        cluster.server, ca_file=str(cluster.workdir / "pki" / "ca.crt"), token=FileToken(token_file)
    )
    async with Client(cfg) as sa:
        with pytest.raises(Forbidden) as e:
            await sa.api(CONFIGMAPS).list(namespace)
        assert e.value.status == 403 and "nobody" in e.value.message


async def test_token_rotation_is_picked_up(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """The token file is swapped (as the kubelet rotates a projected token) from a service account
    without rights to one with rights: the same client, without restarting, is now allowed."""
    k = cluster.kubectl
    for sa in ("nobody", "reader"):
        await asyncio.to_thread(k, "create", "serviceaccount", sa, "-n", namespace)
    await asyncio.to_thread(
        k, "create", "role", "cm-reader", "--verb=list", "--resource=configmaps", "-n", namespace
    )
    await asyncio.to_thread(
        k,
        "create",
        "rolebinding",
        "cm-reader",
        "--role=cm-reader",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
    )
    tokens = {
        sa: (await asyncio.to_thread(k, "create", "token", sa, "-n", namespace)).stdout.strip()
        for sa in ("nobody", "reader")
    }
    token_file = tmp_path / "token"
    token_file.write_text(tokens["nobody"])
    cfg = ClientConfig(
        cluster.server, ca_file=str(cluster.workdir / "pki" / "ca.crt"), token=FileToken(token_file)
    )
    async with Client(cfg) as c:
        with pytest.raises(Forbidden):
            await c.api(CONFIGMAPS).list(namespace)
        rotated = tmp_path / "token.new"
        rotated.write_text(tokens["reader"])
        rotated.replace(token_file)
        async with asyncio.timeout(15):  # the RoleBinding may take a moment to apply
            while True:
                try:
                    await c.api(CONFIGMAPS).list(namespace)
                    break
                except Forbidden as e:
                    assert "reader" in e.message, "the new token must be the one sent"
                    await asyncio.sleep(0.2)


async def test_in_cluster_configuration(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(cluster.kubectl, "create", "serviceaccount", "pod-sa", "-n", namespace)
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(
        (
            await asyncio.to_thread(cluster.kubectl, "create", "token", "pod-sa", "-n", namespace)
        ).stdout.strip()
    )
    shutil.copy(cluster.workdir / "pki" / "ca.crt", sa_dir / "ca.crt")
    (sa_dir / "namespace").write_text(namespace)
    port = cluster.server.rsplit(":", 1)[1]
    cfg = load_incluster(
        sa_dir, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    )
    async with Client(cfg) as c:
        review = await c.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json_body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    user = review["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{namespace}:pod-sa"
    assert cfg.namespace == namespace


async def test_discovery_of_a_crd(client: Client) -> None:
    tp = await client.resource("kubeckpt.io/v1alpha1", "TrainingProgress")
    assert (tp.plural, tp.namespaced, "status" in tp.subresources) == (
        "trainingprogresses",
        True,
        True,
    )
    assert await client.resource("kubeckpt.io/v1alpha1", "tp") == tp  # short name
    assert (await client.resource("v1", "pods")).subresources >= {"exec", "log", "status"}
    with pytest.raises(ResourceNotFound):
        await client.resource("kubeckpt.io/v1alpha1", "Nope")
    with pytest.raises(ResourceNotFound):
        await client.resource("nope.example.com/v1", "Thing")


async def test_gone_for_a_compacted_resource_version(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    cms = client.api(CONFIGMAPS)
    old = await cms.create(cm("old", namespace))
    await cms.create(cm("newer", namespace))  # the revision moves past `old`
    await asyncio.to_thread(compact_etcd, cluster)
    with pytest.raises(Gone) as e:
        await cms.list(
            namespace,
            resource_version=old["metadata"]["resourceVersion"],
            resource_version_match="Exact",
        )
    assert e.value.status == 410


async def test_paginated_list_restarts_when_its_continue_token_expires(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    cms = client.api(CONFIGMAPS)
    # The controller-manager publishes kube-root-ca.crt into a new namespace on its own time
    # (under load, after this test had listed): wait for it, so the list has 8 objects.
    for _ in range(300):
        try:
            await cms.get("kube-root-ca.crt", namespace)
            break
        except NotFound:
            await asyncio.sleep(0.2)
    for i in range(6):
        await cms.create(cm(f"p{i}", namespace))

    class CompactAfterFirstPage(ResourceClient):
        pages = 0

        async def list(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            page = await super().list(*args, **kwargs)
            self.pages += 1
            if self.pages == 1:
                # A write moves the revision on; compacting there expires the continue token.
                await cms.create(cm("during", namespace))
                await asyncio.to_thread(compact_etcd, cluster)
            return page

    api = CompactAfterFirstPage(client, CONFIGMAPS)
    result = await api.list_all(namespace, page_size=2)
    assert result.restarts == 1
    names = sorted(o["metadata"]["name"] for o in result.items)
    assert names == sorted(["during", "kube-root-ca.crt", *(f"p{i}" for i in range(6))])
    assert api.pages == 1 + 4  # the expired first page, then 8 objects in pages of 2


def test_admin_config_loads_client_certificate(cluster: LocalCluster) -> None:
    cfg = admin_config(cluster)
    assert cfg.server == cluster.server
    assert cfg.cert_file and cfg.key_file and cfg.token is None
