"""Where a job's checkpoints are, as the webhook mounts them into its pods: one plan for every
pod that needs them, the training pod (webhook/mutation.py) and the CLI's lister pod
(kubeckpt_cli/lister_pod.py), so that both see the job's directory at the same path.
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .jobkinds import JobIdentity
from .policy import Policy

STORAGE_VOLUME = "kubeckpt-storage"
AWS_SECRET_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
# The controller image holds the whole distribution, trainer_runtime included.
DEFAULT_RUNTIME_IMAGE = f"kubeckpt/kubeckpt:{__version__}"
RUNTIME_UID = 65532  # the image's non-root user


def storage_plan(
    policy: Policy, namespace: str, job: JobIdentity
) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]]]:
    """(CHECKPOINT_URI, volume, mount, extra env) for the policy's storage URI. Each job gets its
    kind's own directory below it (JobKind.storage_dir): jobs of two kinds never share one."""
    uri = policy.storage_uri
    per_job = job.job_kind.storage_dir(namespace, job.name)
    if uri.startswith("pvc://"):
        claim, _, path = uri[len("pvc://") :].partition("/")
        sub = "/".join(p for p in (path.strip("/"), per_job) if p)
        mount_path = f"{policy.mount_path.rstrip('/')}/{per_job}"
        volume = {"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
        # subPath per job: a job sees only its own checkpoints.
        mount = {"name": STORAGE_VOLUME, "mountPath": mount_path, "subPath": sub}
        return mount_path, volume, mount, []
    if uri.startswith("s3://"):
        env = []
        if policy.secret_name:
            # References only: the Secret's values never pass through the webhook.
            env = [
                {
                    "name": key,
                    "valueFrom": {
                        "secretKeyRef": {"name": policy.secret_name, "key": key, "optional": True}
                    },
                }
                for key in AWS_SECRET_KEYS
            ]
        return f"{uri.rstrip('/')}/{per_job}", None, None, env
    if uri.startswith("file://"):
        return f"{uri[len('file://') :].rstrip('/')}/{per_job}", None, None, []
    raise ValueError(f"unsupported storage URI {uri!r}")
