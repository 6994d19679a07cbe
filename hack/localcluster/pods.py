"""Waiting for pods on the real node, failing at once, with what to do, when one cannot start.

A kubelet retries a missing image or a broken container config forever (backing off); a test or
the demo that only polled the phase would hang until its timeout and then say nothing useful.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .handle import ClusterHandle

# Waiting reasons that do not resolve by themselves.
IMAGE_REASONS = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


class PodNotStarting(RuntimeError):
    """A pod's container cannot start; the message names the container, the reason and the fix."""


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why a pod's container cannot start (and will not by waiting), or None."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "?")
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in IMAGE_REASONS:
            return (
                f"pod {name}, container {cs['name']}: image {cs.get('image')!r} is not on the "
                f"node ({reason}); the local cluster pulls nothing: build and import it with "
                "`make images` (hack/images/build.sh), or use a kubeckpt.local/ image that "
                "script builds"
            )
        message = waiting.get("message", "")
        # "failed to sync secret/configmap cache: timed out": the kubelet's informer was slow (a
        # loaded machine) and it retries; a missing Secret or key says so otherwise.
        if reason in CONFIG_REASONS and "failed to sync" not in message:
            return f"pod {name}, container {cs['name']}: {reason}: {message}"
    return None


def get_pod(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any] | None:
    p = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def wait_pod(
    cluster: ClusterHandle,
    namespace: str,
    name: str,
    until: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 120,
) -> dict[str, Any]:
    """Poll the pod until `until(pod)`; raise PodNotStarting as soon as it cannot start."""
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        pod = get_pod(cluster, namespace, name)
        if pod is not None:
            if until(pod):
                return pod
            problem = pod_problem(pod)
            if problem:
                raise PodNotStarting(problem)
        time.sleep(0.5)
    phase = ((pod or {}).get("status") or {}).get("phase")
    raise TimeoutError(f"pod {namespace}/{name} not {what} after {timeout:.0f} s (phase {phase})")


def running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all((cs.get("state") or {}).get("running") for cs in statuses)


def terminated(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all((cs.get("state") or {}).get("terminated") for cs in statuses)


def container_terminated(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs["name"] == container:
            return (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
    return None
