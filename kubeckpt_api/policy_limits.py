"""The policy is the ceiling: a per-job annotation may lower a limit, never raise it.

A CheckpointPolicy is written by the namespace's editors (or the cluster admin); the per-job
override annotations by whoever creates the job. Some settings are limits on what a job costs
others: how long a node drain waits for the job's pods (`jit.maxGracePeriodSeconds`; and whether
the job gets the preStop hook and extended grace period at all, `jit.enabled`), how much node
memory its ramdisk tier may take (`localTier.enabled`, `localTier.sizeLimit`, or the size derived
from `localTier.modelParameters`), how many checkpoints it keeps on shared storage
(`maxCheckpoints`). An annotation that asks for more than the policy allows is clamped to the
policy's value, with an admission warning and a `skipped` entry in the pod's status annotation.
The other overrides (interval, strategy, save-steps, resume, local-period-steps,
progress-every-steps, instrumentation-auto) are the job's own trade-offs and apply as given.

Pure: `cap_overrides(policy, asked, nodes=...)` takes the policy and the result of
`apply_overrides` and returns what applies and what was clamped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .policy import Policy
from .policy_model import parse_quantity

# The ramdisk tier's size when the policy gives neither sizeLimit nor modelParameters.
DEFAULT_LOCAL_SIZE = "8Gi"
# The `skipped` entry of a clamped override: `override/<annotation suffix>`.
SKIPPED_PREFIX = "override/"
# The annotation suffixes that are limits (README, "The admission webhook"), and the Policy
# attribute each one sets. `model-parameters` is a limit through the size it derives.
LIMITS: dict[str, str] = {
    "max-grace-period-seconds": "max_grace_seconds",
    "max-checkpoints": "max_checkpoints",
    "jit": "jit",
    "local-tier": "local_enabled",
    "local-size-limit": "local_size_limit",
    "model-parameters": "local_model_parameters",
}


def local_size_limit(policy: Policy, nodes: int) -> str:
    """DESIGN.md: sizeLimit, else 2 x (params x 12 B / nodes) x 1.15, else the default. With peer
    copies (`localTier.peerCopy`) the derived size counts the ring predecessor's copy too, kept
    the same way (one complete, one arriving): 4 x. An explicit sizeLimit stays the bound (the
    receiver refuses a copy that does not fit)."""
    if policy.local_size_limit:
        return policy.local_size_limit
    if policy.local_model_parameters:
        per_node = policy.local_model_parameters * 12 / max(nodes, 1)
        copies = 4 if policy.local_peer_copy else 2
        mib = math.ceil(copies * per_node * 1.15 / 2**20)
        return f"{max(mib, 1)}Mi"
    return DEFAULT_LOCAL_SIZE


@dataclass(frozen=True)
class Clamp:
    """One override that asked for more than the policy allows."""

    annotation: str  # the suffix: "max-grace-period-seconds"
    asked: str
    applied: str
    policy: str

    @property
    def skipped(self) -> str:
        return SKIPPED_PREFIX + self.annotation

    @property
    def warning(self) -> str:
        return (
            f"kubeckpt: kubeckpt.io/{self.annotation}={self.asked} is above CheckpointPolicy "
            f"{self.policy}'s limit; {self.applied} applies"
        )


def _flag(value: bool) -> str:
    return "true" if value else "false"


def cap_overrides(policy: Policy, asked: Policy, *, nodes: int) -> tuple[Policy, list[Clamp]]:
    """`asked` (the policy with the pod's overrides) with every limit held to `policy`'s, and the
    overrides that were clamped, in a fixed order. `nodes` is how many pods the job spans (the
    derived local-tier size is per node)."""
    clamps: list[Clamp] = []
    out = asked

    def clamp(annotation: str, asked_text: str, applied_text: str, **changes: object) -> None:
        nonlocal out
        out = replace(out, **changes)
        clamps.append(Clamp(annotation, asked_text, applied_text, policy.name))

    if asked.max_grace_seconds > policy.max_grace_seconds:
        clamp(
            "max-grace-period-seconds",
            str(asked.max_grace_seconds),
            str(policy.max_grace_seconds),
            max_grace_seconds=policy.max_grace_seconds,
        )
    if asked.max_checkpoints > policy.max_checkpoints:
        clamp(
            "max-checkpoints",
            str(asked.max_checkpoints),
            str(policy.max_checkpoints),
            max_checkpoints=policy.max_checkpoints,
        )
    if asked.jit and not policy.jit:
        clamp("jit", "true", "false", jit=False)
    if asked.local_enabled and not policy.local_enabled:
        clamp("local-tier", "true", "false", local_enabled=False)
    if out.local_enabled:
        ceiling = local_size_limit(policy, nodes)
        size = local_size_limit(out, nodes)
        if parse_quantity(size) > parse_quantity(ceiling):
            own_limit = out.local_size_limit and out.local_size_limit != policy.local_size_limit
            if own_limit:
                annotation, asked_text = "local-size-limit", size
            else:
                annotation, asked_text = "model-parameters", str(out.local_model_parameters)
            clamp(
                annotation,
                asked_text,
                ceiling,
                local_size_limit=ceiling,
                local_model_parameters=policy.local_model_parameters,
            )
    return out, clamps
