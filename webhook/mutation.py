"""Pod mutation: a pure function of (pod, policy, namespace, the job's last TrainingProgress).

It returns the patched pod and the RFC 6902 JSONPatch that produces it. The patch is built op by
op (arrays that are absent are added whole, arrays that exist are appended to with `/-`), then
applied with `jsonpatch` so the patched pod is by construction what the API server will store.
Nothing the user set is overwritten (but for the push CA annotation, which is ours to set: a pod
cannot choose what the webhook vouches for); what we did not add is listed in the status annotation.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from kubeckpt_api import __version__
from kubeckpt_api.jobkinds import job_identity, ownership_problem
from kubeckpt_api.optin import (
    INJECTED_LABEL,
    STATUS_ANNOTATION,
    opted_in,
)
from kubeckpt_api.policy import MIN_GRACE_SECONDS, Policy, apply_overrides, policy_from_object
from kubeckpt_api.policy_limits import cap_overrides, local_size_limit
from kubeckpt_api.status_bounds import in_range, step_seconds
from kubeckpt_api.storage import DEFAULT_RUNTIME_IMAGE, RUNTIME_UID, storage_plan
from trainer_runtime.contract import (
    CHECKPOINT_CONTROL_DIR,
    CHECKPOINT_ENABLED,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_JIT,
    CHECKPOINT_LOCAL_DIR,
    CHECKPOINT_LOCAL_PERIOD,
    CHECKPOINT_MAX_CHECKPOINTS,
    CHECKPOINT_RESUME,
    CHECKPOINT_SAVE_STEPS,
    CHECKPOINT_STRATEGY,
    CHECKPOINT_URI,
    DONE_FILE,
    FAILED_FILE,
    KUBECKPT_JOB_KIND,
    KUBECKPT_JOB_NAME,
    KUBECKPT_NAMESPACE,
    PROGRESS_UPDATE_FREQUENCY,
    REQUEST_FILE,
    RUN_DIR,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    TRAINING_PROGRESS_FILE,
)
from trainer_runtime.contract.env import (
    CHECKPOINT_LOCAL_PEER,
    CHECKPOINT_ON_UNVERIFIABLE,
    KUBECKPT_POD_IP,
    ON_UNVERIFIABLE_FAIL,
)
from trainer_runtime.zerocode import pythonpath_entries

from .push_injection import PUSH_CA_ANNOTATION, PUSH_VOLUME, push_env, push_volume

RUN_VOLUME = "kubeckpt-run"
LOCAL_VOLUME = "kubeckpt-local"
LOCAL_DIR = f"{RUN_DIR}/local"
PROGRESS_PATH = f"{RUN_DIR}/progress.json"
# Zero-code mode (instrumentation.auto): an init container copies the runtime into its own
# emptyDir, mounted read-only into the target container, whose PYTHONPATH then starts with it.
RUNTIME_VOLUME = "kubeckpt-runtime"
RUNTIME_DIR = "/var/run/kubeckpt-runtime"
RUNTIME_INIT_CONTAINER = "kubeckpt-runtime"
PYTHONPATH = "PYTHONPATH"
USER_PYTHONPATH = "KUBECKPT_USER_PYTHONPATH"  # the user's valueFrom PYTHONPATH, renamed
# The operator-set env that says how many nodes (pods) a job spans, for the local tier's size.
NODE_COUNT_ENV = ("PET_NNODES", "JAX_NUM_PROCESSES", "KUBECKPT_NODES")
# The `skipped` entry of a pod whose labels name a job that does not own it (not injected).
OWNERSHIP_SKIPPED = "ownership"
# Grace: one step plus one save, with 50 % and 10 s of headroom for the preStop round trip.
GRACE_FACTOR = 1.5
GRACE_HEADROOM_SECONDS = 10
SAVE_SECONDS = ("checkpointing", "lastSaveSeconds")  # its path in status_bounds


@dataclass
class MutationResult:
    pod: dict[str, Any]
    patch: list[dict[str, Any]]
    reason: str  # why injected or not, for logs and metrics
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    injected: bool = False


def grace_seconds(policy: Policy, progress: object) -> int:
    """Enough for one step and one save when the job measured them, else the policy's bound.

    The times come from a TrainingProgress, i.e. from what a training pod reported: each is used
    only as the decimal string the CRD stores and within kubeckpt_api.status_bounds (a step of at
    most an hour, a save of at most a day). Anything else, of any shape, is ignored and the
    policy's bound applies, so no record can raise here (a huge lastSaveSeconds once did, and
    every later pod of that job was admitted uninjected).
    """
    status = _field(progress, "status")
    step = step_seconds(_text(_field(status, "stepSeconds")))
    save = in_range(SAVE_SECONDS, _text(_field(_field(status, "checkpointing"), "lastSaveSeconds")))
    if save is None:
        return policy.max_grace_seconds
    need = math.ceil((save + (step or 0.0)) * GRACE_FACTOR + GRACE_HEADROOM_SECONDS)
    return max(MIN_GRACE_SECONDS, min(need, policy.max_grace_seconds))


def _field(obj: object, key: str) -> object:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _text(value: object) -> str | None:
    """The CRD stores these times as decimal strings: anything else is not a stored value."""
    return value if isinstance(value, str) else None


def shutdown_margin(grace: int) -> int:
    """Seconds kept back from the grace period for the process to exit after the save."""
    return max(2, min(10, grace // 6))


def _esc(token: str) -> str:
    """RFC 6901 escaping of one JSON-pointer token."""
    return token.replace("~", "~0").replace("/", "~1")


def prestop_command(wait_seconds: int) -> list[str]:
    """The preStop hook: ask the runtime for a checkpoint and wait for its answer, bounded.

    Uses the runtime's `kubeckpt-prestop` when the image has it, else plain sh, so images that
    never installed kubeckpt still get the request written (the zero-code runtime answers it).
    """
    d = RUN_DIR
    script = (
        f"if command -v kubeckpt-prestop >/dev/null 2>&1; then "
        f"exec kubeckpt-prestop --timeout {wait_seconds}; fi; "
        f'rm -f "{d}/{DONE_FILE}" "{d}/{FAILED_FILE}"; '
        f'date +%s > "{d}/{REQUEST_FILE}"; i=0; '
        f"while [ $i -lt {wait_seconds} ]; do "
        f'if [ -e "{d}/{DONE_FILE}" ] || [ -e "{d}/{FAILED_FILE}" ]; then exit 0; fi; '
        f"sleep 1; i=$((i+1)); done; exit 0"
    )
    return ["/bin/sh", "-c", script]


def _nodes(container: Mapping[str, Any]) -> int:
    """How many nodes (pods) the job spans, from the env its operator set: PET_NNODES (torch),
    JAX_NUM_PROCESSES (Trainer's JAX plugin: one JAX process per node)."""
    for e in container.get("env") or []:
        if e.get("name") in NODE_COUNT_ENV and "value" in e:
            try:
                return max(1, int(str(e["value"]).split(":")[-1]))
            except ValueError:
                pass
    return 1


def runtime_init_container(image: str) -> dict[str, Any]:
    """The init container that installs the runtime into the shared volume (zero-code mode)."""
    return {
        "name": RUNTIME_INIT_CONTAINER,
        "image": image,
        "command": ["python", "-m", "trainer_runtime.zerocode.install", RUNTIME_DIR],
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR}],
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"memory": "128Mi"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Set here, not left to the pod: it must hold whatever the pod's own securityContext says.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _zerocode_plan(
    spec: Mapping[str, Any], container: Mapping[str, Any], cpath: str
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """(ops on the user's env entries, a PYTHONPATH entry to append, why not) for zero-code mode.

    The user's PYTHONPATH is kept: a plain value gets our entries prepended; one from valueFrom is
    renamed to KUBECKPT_USER_PYTHONPATH and our PYTHONPATH, inserted right after it so later
    entries that use $(PYTHONPATH) see the combined value, ends with $(KUBECKPT_USER_PYTHONPATH).
    Any name or path of ours already taken: nothing is added (a half set-up would be worse).
    """
    names = {c.get("name") for c in (spec.get("initContainers") or [])}
    names |= {c.get("name") for c in (spec.get("containers") or [])}
    if RUNTIME_INIT_CONTAINER in names:
        return [], None, f"container name {RUNTIME_INIT_CONTAINER} is taken"
    if RUNTIME_VOLUME in {v.get("name") for v in spec.get("volumes") or []}:
        return [], None, f"volume name {RUNTIME_VOLUME} is taken"
    for m in container.get("volumeMounts") or []:
        if m.get("name") == RUNTIME_VOLUME or m.get("mountPath", "").rstrip("/") == RUNTIME_DIR:
            return [], None, f"mount path {RUNTIME_DIR} is taken"
    ours = ":".join(pythonpath_entries(RUNTIME_DIR))
    env = container.get("env") or []
    index = next((i for i in reversed(range(len(env))) if env[i].get("name") == PYTHONPATH), None)
    if index is None:
        # A PYTHONPATH from envFrom is expanded into $(PYTHONPATH); without one it stays a
        # literal, a path entry that does not exist, which Python skips.
        value = f"{ours}:$({PYTHONPATH})" if container.get("envFrom") else ours
        return [], {"name": PYTHONPATH, "value": value}, None
    entry = env[index]
    epath = f"{cpath}/env/{index}"
    if "valueFrom" not in entry:
        user = str(entry.get("value") or "")
        if RUNTIME_DIR in user.split(":"):
            return [], None, None  # already there (set by hand)
        value = f"{ours}:{user}" if user else ours
        return [{"op": "add", "path": f"{epath}/value", "value": value}], None, None
    if any(e.get("name") == USER_PYTHONPATH for e in env):
        return [], None, f"env name {USER_PYTHONPATH} is taken"
    combined = {"name": PYTHONPATH, "value": f"{ours}:$({USER_PYTHONPATH})"}
    return (
        [
            {"op": "replace", "path": f"{epath}/name", "value": USER_PYTHONPATH},
            {"op": "add", "path": f"{cpath}/env/{index + 1}", "value": combined},
        ],
        None,
        None,
    )


def mutate(
    pod: Mapping[str, Any],
    policy_obj: Mapping[str, Any] | None,
    namespace: Mapping[str, Any] | None,
    progress: object = None,
    *,
    namespace_name: str | None = None,
    copy_pod: bool = True,
    runtime_image: str = DEFAULT_RUNTIME_IMAGE,
    push_ca: str | None = None,
) -> MutationResult:
    """Decide and build the mutation for one pod. Never raises on odd pods: skips them.

    `pod` is left as it was. With `copy_pod=False` the caller hands over a dict that nothing else
    uses (the server's freshly parsed request object): it is patched in place and becomes the
    result's `pod`, instead of being deep-copied first (a third of the admission handler's time).
    `push_ca`: the progress push endpoint's CA (validated PEM, webhook/push_ca.py), stamped on a
    push pod and projected as its ca.crt; None: the pod reads the namespace's ConfigMap instead.
    """
    original = pod if not copy_pod and isinstance(pod, dict) else copy.deepcopy(dict(pod))
    meta = original.get("metadata") or {}
    labels: dict[str, str] = meta.get("labels") or {}
    annotations: dict[str, str] = meta.get("annotations") or {}
    ns = (
        namespace_name
        or meta.get("namespace")
        or ((namespace or {}).get("metadata") or {}).get("name", "")
    )

    def unchanged(
        reason: str, warnings: list[str] | None = None, skipped: list[str] | None = None
    ) -> MutationResult:
        return MutationResult(original, [], reason, warnings or [], skipped or [])

    job = job_identity(labels)
    if job is None:
        return unchanged("not a training pod")
    if not opted_in(labels, namespace):
        return unchanged("not opted in")
    if (problem := ownership_problem(job, meta)) is not None:
        # A bare pod labelled as a job's would get the job's storage and grace period.
        return unchanged(
            f"not a pod of {job.kind} {job.name}: {problem}",
            [f"kubeckpt: not injected as a pod of {job.kind} {job.name}: {problem}"],
            [OWNERSHIP_SKIPPED],
        )
    if labels.get(INJECTED_LABEL) == "true" or STATUS_ANNOTATION in annotations:
        return unchanged("already injected")
    if policy_obj is None:
        return unchanged("no matching CheckpointPolicy")
    try:
        base = policy_from_object(policy_obj)
    except ValueError as e:
        return unchanged("unusable CheckpointPolicy", [f"kubeckpt: policy ignored: {e}"])
    policy, warnings = apply_overrides(base, annotations)
    spec = original.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return unchanged("pod has no containers")
    index = next((i for i, c in enumerate(containers) if c.get("name") == job.target_container), 0)
    container = containers[index]
    # The policy is the ceiling: an override may lower a limit, never raise it.
    policy, clamps = cap_overrides(base, policy, nodes=_nodes(container))
    warnings += [c.warning for c in clamps]
    try:
        uri, storage_volume, storage_mount, secret_env = storage_plan(policy, ns, job)
    except ValueError as e:
        return unchanged("unusable storage", [f"kubeckpt: {e}"])

    ops: list[dict[str, Any]] = []
    skipped: list[str] = [c.skipped for c in clamps]
    cpath = f"/spec/containers/{index}"

    # --- zero-code mode: its edits of the user's env go first, while their indices hold --------
    zerocode = False
    zerocode_env: dict[str, Any] | None = None
    if policy.auto_instrumentation:
        env_ops, zerocode_env, why_not = _zerocode_plan(spec, container, cpath)
        if why_not:
            skipped.append("instrumentation/auto")
            warnings.append(f"kubeckpt: zero-code instrumentation not added: {why_not}")
        else:
            zerocode = True
            ops += env_ops

    # --- env -----------------------------------------------------------------------------------
    env: list[dict[str, Any]] = [
        {"name": TRAINING_PROGRESS_FILE, "value": PROGRESS_PATH},
        {"name": CHECKPOINT_ENABLED, "value": "true"},
        {"name": CHECKPOINT_URI, "value": uri},
        {"name": CHECKPOINT_INTERVAL, "value": str(policy.interval_seconds)},
        {"name": CHECKPOINT_STRATEGY, "value": policy.strategy},
        {"name": CHECKPOINT_MAX_CHECKPOINTS, "value": str(policy.max_checkpoints)},
        {"name": CHECKPOINT_RESUME, "value": _b(policy.resume)},
        {"name": CHECKPOINT_JIT, "value": _b(policy.jit)},
        {"name": CHECKPOINT_CONTROL_DIR, "value": RUN_DIR},
        {"name": PROGRESS_UPDATE_FREQUENCY, "value": str(policy.progress_every_steps)},
        {"name": KUBECKPT_JOB_KIND, "value": job.kind},
        {"name": KUBECKPT_JOB_NAME, "value": job.name},
        {
            "name": KUBECKPT_NAMESPACE,
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
        },
    ]
    if policy.strategy == "steps" and policy.save_steps:
        env.append({"name": CHECKPOINT_SAVE_STEPS, "value": str(policy.save_steps)})
    if policy.on_unverifiable_checkpoints != ON_UNVERIFIABLE_FAIL:
        # Only when loosened: the runtime's default is the policy's (Fail).
        env.append(
            {"name": CHECKPOINT_ON_UNVERIFIABLE, "value": policy.on_unverifiable_checkpoints}
        )
    if policy.local_enabled:
        env.append({"name": CHECKPOINT_LOCAL_DIR, "value": LOCAL_DIR})
        env.append({"name": CHECKPOINT_LOCAL_PERIOD, "value": str(policy.local_period_steps)})
        if policy.local_peer_copy:
            # Peer copies (issue 28): the node's coordinator serves them on the pod IP.
            env.append({"name": CHECKPOINT_LOCAL_PEER, "value": "true"})
            env.append(
                {
                    "name": KUBECKPT_POD_IP,
                    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
                }
            )
    grace = grace_seconds(policy, progress) if policy.jit else None
    if grace is not None:
        current = spec.get("terminationGracePeriodSeconds")
        effective = max(grace, current or 0)
        env.append(
            {
                "name": TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
                "value": str(effective - shutdown_margin(effective)),
            }
        )
    env += secret_env
    if policy.progress_push:
        env += push_env(job, ns, container)
    if zerocode_env is not None:
        env.append(zerocode_env)
    have_env = {e.get("name") for e in container.get("env") or []}
    new_env = []
    for e in env:
        if e["name"] in have_env:
            skipped.append(f"env/{e['name']}")
        else:
            new_env.append(e)
    ops += _append(f"{cpath}/env", container.get("env"), new_env)

    # --- volumes and mounts --------------------------------------------------------------------
    volumes: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"name": RUN_VOLUME, "emptyDir": {}}, {"name": RUN_VOLUME, "mountPath": RUN_DIR})
    ]
    if storage_volume is not None and storage_mount is not None:
        volumes.append((storage_volume, storage_mount))
    if policy.local_enabled:
        size = local_size_limit(policy, _nodes(container))
        volumes.append(
            (
                {"name": LOCAL_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}},
                {"name": LOCAL_VOLUME, "mountPath": LOCAL_DIR},
            )
        )
    if policy.progress_push:
        volumes.append(push_volume(ca_from_annotation=push_ca is not None))
    if zerocode:
        volumes.append(
            (
                {"name": RUNTIME_VOLUME, "emptyDir": {}},
                {"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR, "readOnly": True},
            )
        )
    have_volumes = {v.get("name") for v in spec.get("volumes") or []}
    have_paths = {m.get("mountPath", "").rstrip("/") for m in container.get("volumeMounts") or []}
    have_mount_names = {m.get("name") for m in container.get("volumeMounts") or []}
    new_volumes, new_mounts = [], []
    for volume, mount in volumes:
        if volume["name"] in have_volumes:
            # A volume of that name is the user's: mounting it under our path could expose it.
            skipped.append(f"volume/{volume['name']}")
            continue
        new_volumes.append(volume)
        if mount["mountPath"].rstrip("/") in have_paths or mount["name"] in have_mount_names:
            skipped.append(f"volumeMount/{mount['mountPath']}")
        else:
            new_mounts.append(mount)
    ops += _append("/spec/volumes", spec.get("volumes"), new_volumes)
    ops += _append(f"{cpath}/volumeMounts", container.get("volumeMounts"), new_mounts)
    if zerocode:
        init = runtime_init_container(runtime_image)
        ops += _append("/spec/initContainers", spec.get("initContainers"), [init])

    # --- preStop and grace period --------------------------------------------------------------
    if grace is not None:
        lifecycle = container.get("lifecycle")
        effective = max(grace, spec.get("terminationGracePeriodSeconds") or 0)
        hook = {"exec": {"command": prestop_command(effective - shutdown_margin(effective))}}
        if lifecycle and lifecycle.get("preStop"):
            skipped.append("lifecycle/preStop")
        elif lifecycle is None:
            ops.append({"op": "add", "path": f"{cpath}/lifecycle", "value": {"preStop": hook}})
        else:
            ops.append({"op": "add", "path": f"{cpath}/lifecycle/preStop", "value": hook})
        current = spec.get("terminationGracePeriodSeconds")
        if current is not None and current >= grace:
            if current > grace:
                skipped.append("terminationGracePeriodSeconds")
        else:
            op = "add" if current is None else "replace"
            ops.append({"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": grace})

    # --- marker ----------------------------------------------------------------------------------
    status = {
        "policy": policy.name,
        "container": container.get("name", ""),
        "version": __version__,
    }
    if zerocode:
        status["instrumentation"] = "auto"
    if skipped:
        status["skipped"] = skipped  # type: ignore[assignment]
    if grace is not None:
        status["gracePeriodSeconds"] = max(grace, spec.get("terminationGracePeriodSeconds") or 0)  # type: ignore[assignment]
    ops += _put_map("/metadata/labels", meta.get("labels"), {INJECTED_LABEL: "true"})
    stamps = {STATUS_ANNOTATION: json.dumps(status, separators=(",", ":"), sort_keys=True)}
    if push_ca is not None and any(v["name"] == PUSH_VOLUME for v in new_volumes):
        # Only with our volume, which reads it; set over whatever the pod carried.
        stamps[PUSH_CA_ANNOTATION] = push_ca
    ops += _put_map("/metadata/annotations", meta.get("annotations"), stamps)
    # `original` is this call's own copy (or the handed-over pod) and is not used again: patch it
    # in place rather than let jsonpatch deep-copy the whole pod a second time.
    patched = jsonpatch.apply_patch(original, ops, in_place=True)
    return MutationResult(
        patched, ops, "injected", warnings=warnings, skipped=skipped, injected=True
    )


def _b(v: bool) -> str:
    return "true" if v else "false"


def _append(path: str, current: list | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add the array when absent, else append item by item."""
    if not items:
        return []
    if current is None:
        return [{"op": "add", "path": path, "value": items}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]


def _put_map(path: str, current: dict | None, items: dict[str, str]) -> list[dict[str, Any]]:
    """Set keys of a map, adding the map when absent (an `add` of a key that exists replaces it)."""
    if current is None:
        return [{"op": "add", "path": path, "value": dict(items)}]
    return [{"op": "add", "path": f"{path}/{_esc(k)}", "value": v} for k, v in items.items()]
