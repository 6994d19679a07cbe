"""A short-lived lister pod: `kubeckpt checkpoints JOB` for a job with no running rank-0 pod.

A finished or deleted job's checkpoints are still on its storage, which only a pod can reach. So
the CLI creates one in the job's namespace that sees the job's own directory exactly as the
webhook gave it to the training pod (the webhook's `kubeckpt_api.storage.storage_plan`: the
same path or URI, so a recorded `latestCheckpoint` names the same location), and runs the same
listing the rank-0 pod runs (`python -m trainer_runtime.listing`). Its output is read from the
pod's log.

- `pvc://`: the claim, mounted read-only at the job's subPath.
- `s3://`: the job's prefix of the bucket, with the policy Secret's AWS_* keys (credentials,
  region, endpoint) as env by `secretKeyRef`, as the training pod has them: the pod reads the
  Secret, the CLI never does, and its values are never in the manifest. The image needs
  fsspec/s3fs (the runtime image has them); one without is named (`missing_packages`).
- `file://`: only inside the training pod (a path of its own filesystem): refused.

Least privilege: non-root, read-only root filesystem, every capability dropped, no service
account token, no Service links, small resource limits, `activeDeadlineSeconds` as the timeout.
It is deleted when the listing ends, however it ends; and pods a killed CLI left behind are found
by their label and deleted by the next run (`remove_stale`).

Storage: the namespace's CheckpointPolicy says it (`--policy` picks one; without it, the only
usable policy, or the one whose storage holds the recorded latest checkpoint).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubeckpt_api.groupversion import CHECKPOINT_POLICY
from kubeckpt_api.jobkinds import JobIdentity, JobKind
from kubeckpt_api.policy import policy_from_object
from kubeckpt_api.storage import DEFAULT_RUNTIME_IMAGE, RUNTIME_UID, storage_plan
from reconciler.errors import NotFound
from reconciler.resources import PODS
from trainer_runtime.contract import ContractError

from .cluster import Cluster
from .errors import CliError
from .view import clean, now_utc, parse_time

MODULE = "trainer_runtime.listing"
CONTAINER = "list"
# Every lister pod carries it: how a later run finds the ones a killed CLI left behind.
LISTER_LABEL = "kubeckpt.io/checkpoint-lister"
JOB_LABEL = "kubeckpt.io/checkpoint-lister-job"  # the job listed, for `kubectl get pods -L`
MANAGED_BY = ("app.kubernetes.io/managed-by", "kubeckpt-cli")
IMAGE_ENV = "KUBECKPT_RUNTIME_IMAGE"  # as the webhook's: an image that holds trainer_runtime
STALE_SECONDS = 600  # a lister pod older than this is left over (the timeout is far shorter)
POLL_SECONDS = 0.5
PLACEMENT = ("nodeSelector", "affinity", "tolerations")  # copied from a pod of the job
# No ephemeral-storage limit: it would request as much (a node without that resource could not
# take the pod), and the pod writes nothing (read-only root filesystem, no emptyDir).
RESOURCES = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_UID,
    "runAsGroup": RUNTIME_UID,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True)
class ListerStorage:
    """Where the job's checkpoints are, as the training pod saw them."""

    policy: str
    checkpoint_uri: str  # the training pod's CHECKPOINT_URI: a path inside the pod, or s3://
    volume: dict[str, Any] | None = None  # pvc://: the claim, and where it is mounted
    mount: dict[str, Any] | None = None
    env: tuple[dict[str, Any], ...] = ()  # s3://: the Secret's keys, by reference only


def _usable(
    objs: Iterable[Mapping[str, Any]], identity: JobIdentity, namespace: str
) -> list[tuple[str, str, ListerStorage | None]]:
    """(policy name, storage URI, storage or None when no other pod can reach it) of each
    policy that parses; an invalid one is skipped, as the webhook skips it."""
    found = []
    for obj in objs:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            policy = policy_from_object(obj)
            uri, volume, mount, env = storage_plan(policy, namespace, identity)
        except (ContractError, ValueError):
            continue
        storage = None
        if volume is not None and mount is not None:
            storage = ListerStorage(policy.name, uri, volume, dict(mount, readOnly=True))
        elif uri.startswith("s3://"):
            # The bucket is reached over the network: what the pod needs is the plan's env.
            storage = ListerStorage(policy.name, uri, env=tuple(env))
        found.append((policy.name, policy.storage_uri, storage))
    return sorted(found)


def choose_storage(
    policies: Iterable[Mapping[str, Any]],
    kind: JobKind,
    namespace: str,
    job: str,
    *,
    policy_name: str | None = None,
    latest: str | None = None,
) -> ListerStorage:
    """The storage a lister pod mounts for the job; CliError saying why none can be chosen.

    A deleted job's pods cannot say which policy the webhook chose (their labels are gone), so:
    `policy_name` when given; else, of the namespace's policies, the one whose mount path holds
    the recorded latest checkpoint (`latest`: a path below a pvc:// mount path, or an s3:// URI
    below the job's prefix); else the only one."""
    identity = JobIdentity(kind, job)
    found = _usable(policies, identity, namespace)
    if policy_name is not None:
        found = [f for f in found if f[0] == policy_name]
        if not found:
            raise CliError(
                f'no usable CheckpointPolicy "{clean(policy_name)}" in namespace "{namespace}"'
            )
    if latest and len(found) > 1:
        holding = [
            f for f in found if f[2] is not None and latest.startswith(f[2].checkpoint_uri + "/")
        ]
        found = holding or found
    if not found:
        raise CliError(f'no usable CheckpointPolicy in namespace "{namespace}" says where')
    if len(found) > 1:
        names = ", ".join(clean(f[0]) for f in found)
        raise CliError(
            f"several CheckpointPolicies could hold them ({names}): pick one with --policy"
        )
    name, uri, storage = found[0]
    if storage is None:
        scheme = uri.split("://", 1)[0]
        raise CliError(
            f'CheckpointPolicy "{clean(name)}" has {clean(uri)}: '
            f"{scheme}:// storage is only inside the training pod"
        )
    return storage


def pod_name(job: str) -> str:
    """`kubeckpt-ls-<job>-<random>`, within a pod name's 63 characters (a DNS label)."""
    return f"kubeckpt-ls-{job[:40].rstrip('-.')}-{secrets.token_hex(4)}"


def lister_pod(
    name: str,
    job: str,
    storage: ListerStorage,
    image: str,
    *,
    deadline_seconds: int,
    max_entries: int,
    max_bytes: int,
    placement: Mapping[str, Any] | None = None,
    verify: bool = False,
) -> dict[str, Any]:
    """The lister pod's manifest (pure: what it may do is all here). `placement`: the spec of
    a pod of the job, when one is left: its nodeSelector, affinity and tolerations are copied,
    since its nodes could mount the storage and the namespace's pods may need them. Storage: a
    pvc:// claim read-only, or an s3:// prefix with the Secret's env by reference, nothing else."""
    placed = {k: (placement or {})[k] for k in PLACEMENT if (placement or {}).get(k)}
    args = ["--persistent", storage.checkpoint_uri]
    args += ["--max-entries", str(max_entries), "--max-bytes", str(max_bytes)]
    args += ["--verify"] if verify else []  # content hashes too, read-only still
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", MODULE, *args],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, *storage.env],
        "resources": RESOURCES,
        "securityContext": SECURITY_CONTEXT,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    volumes: dict[str, Any] = {}
    if storage.volume is not None and storage.mount is not None:
        container["volumeMounts"] = [storage.mount]
        claim = dict(storage.volume["persistentVolumeClaim"], readOnly=True)
        volumes["volumes"] = [{**storage.volume, "persistentVolumeClaim": claim}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LISTER_LABEL: "true", JOB_LABEL: job[:63], MANAGED_BY[0]: MANAGED_BY[1]},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": max(1, deadline_seconds),
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            **placed,
            "securityContext": {
                k: SECURITY_CONTEXT[k]
                for k in ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile")
            },
            "containers": [container],
            **volumes,
        },
    }


def missing_packages(doc: Mapping[str, Any]) -> str | None:
    """The packages the listing's Python lacked to read a tier (fsspec/s3fs for s3://), if
    any: then the image is what to change, not the storage."""
    tiers = doc.get("tiers")
    for tier in tiers if isinstance(tiers, list) else []:  # the pod's output: any shape
        if isinstance(tier, Mapping) and tier.get("missing"):
            return clean(str(tier["missing"]), 60)
    return None


def default_image(environ: Mapping[str, str]) -> str:
    return environ.get(IMAGE_ENV) or DEFAULT_RUNTIME_IMAGE


async def find_policies(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    with cluster.call("list", CHECKPOINT_POLICY.crd_name, namespace):
        res = await cluster.client.resource(CHECKPOINT_POLICY.api_version, CHECKPOINT_POLICY.plural)
        return (await cluster.client.api(res).list_all(namespace)).items


def stale(pod: Mapping[str, Any], now: datetime) -> bool:
    """Whether a lister pod is left over: ended, or older than any listing takes."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() > STALE_SECONDS


async def remove_stale(cluster: Cluster, namespace: str) -> list[str]:
    """Delete the lister pods an earlier run left behind (killed before its own cleanup).
    Returns their names."""
    now = now_utc()
    with cluster.call("list", "pods", namespace):
        pods = await cluster.client.api(PODS).list_all(
            namespace, label_selector=f"{LISTER_LABEL}=true"
        )
    names = [p["metadata"]["name"] for p in pods.items if stale(p, now)]
    for name in names:
        await _delete(cluster, namespace, name)
    return names


async def _delete(cluster: Cluster, namespace: str, name: str) -> None:
    with cluster.call("delete", "pods", namespace):
        try:
            await cluster.client.api(PODS).delete(name, namespace, grace_period_seconds=0)
        except NotFound:
            pass


def _waiting(pod: Mapping[str, Any]) -> str:
    """Why the pod is not done, as kubectl's STATUS column would say (ImagePullBackOff, ...)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return clean(f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": "), 200)
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return clean(str(cond["message"]), 200)
    return clean(str(status.get("phase") or "Pending"))


async def _log(cluster: Cluster, namespace: str, name: str, limit: int) -> tuple[bytes, bool]:
    """The container's log, at most `limit` bytes (and whether it was cut)."""
    path = PODS.path(namespace, name, "log")
    params = [("container", CONTAINER), ("limitBytes", str(limit + 1))]
    with cluster.call("get", "pods/log", namespace):
        _, body = await cluster.client.request_raw("GET", path, params=params)
    return body[:limit], len(body) > limit


async def run_lister_pod(
    cluster: Cluster,
    namespace: str,
    manifest: dict[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - the pod's deadline too
    max_bytes: int,
) -> tuple[int, bytes, bool, str]:
    """Create the pod, wait for it to end (at most `timeout`), read its log, delete it whatever
    happened. Returns (exit code, log, log cut, where) or raises CliError."""
    name = manifest["metadata"]["name"]
    where = f"lister pod {name}"
    with cluster.call("create", "pods", namespace):
        await cluster.client.api(PODS).create(manifest, namespace)
    try:
        pod: Mapping[str, Any] = manifest
        ended = None
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with cluster.call("get", "pods", namespace):
                try:
                    pod = await cluster.client.api(PODS).get(name, namespace)
                except NotFound:
                    raise CliError(f"{where} was deleted before it ended") from None
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                ended = phase
                break
            await asyncio.sleep(POLL_SECONDS)
        if ended is None:
            claim = " and that the claim can be mounted" if manifest["spec"].get("volumes") else ""
            raise CliError(
                f"{where} did not finish in {timeout:g}s ({_waiting(pod)}): retry with a longer "
                f"--timeout, or check the image (--image){claim}"
            )
        code = 0
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode", 0)
        if ended == "Failed" and not code:
            reason = (pod.get("status") or {}).get("reason") or "Failed"
            raise CliError(f"{where} failed ({clean(reason)}): retry with a longer --timeout")
        log, cut = await _log(cluster, namespace, name, max_bytes)
        return int(code), log, cut, where
    finally:
        try:
            await _delete(cluster, namespace, name)
        except CliError as e:  # say so, without hiding what happened before
            print(
                f"kubeckpt: warning: {where} was not deleted ({e.message}): delete it with "
                f"`kubectl delete pod -n {namespace} -l {LISTER_LABEL}=true`",
                file=sys.stderr,
            )


def deadline_for(timeout: float) -> int:
    return max(1, math.ceil(timeout))
