"""kubeckpt's API identity, declared once: the group, the version and the two kinds it serves.

What kubebuilder's `groupversion_info.go` is to a Go operator: the webhook's informers, the
controller's writes, the CLI's discovery and the benchmarks name the API through these, and
tests/unit/test_crds.py checks them against config/crd (the schemas the API server enforces).
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.resources import Resource

GROUP = "kubeckpt.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


@dataclass(frozen=True)
class ApiKind:
    """One kind of the group: its names as the CRD declares them, and the library's `Resource`."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]

    @property
    def api_version(self) -> str:
        return API_VERSION

    @property
    def crd_name(self) -> str:
        """The CRD's name, `<plural>.<group>`, as kubectl and RBAC error messages write it."""
        return f"{self.plural}.{GROUP}"

    @property
    def resource(self) -> Resource:
        # Both kinds are namespaced and have a status subresource (the controller writes it).
        return Resource(GROUP, VERSION, self.plural, self.kind, subresources=frozenset({"status"}))


TRAINING_PROGRESS = ApiKind("TrainingProgress", "trainingprogresses", "trainingprogress", ("tp",))
CHECKPOINT_POLICY = ApiKind(
    "CheckpointPolicy", "checkpointpolicies", "checkpointpolicy", ("ckptpol",)
)
KINDS: tuple[ApiKind, ...] = (TRAINING_PROGRESS, CHECKPOINT_POLICY)
