"""kubeckpt's admission policies (config/policy) on the local control plane, as config/default
renders them, for the tests that act with kubeckpt's own ServiceAccount tokens."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from localcluster import LocalCluster, wait_for

REPO = Path(__file__).resolve().parents[2]
POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
SYSTEM_NS = "kubeckpt-system"
RECONCILER = f"system:serviceaccount:{SYSTEM_NS}:kubeckpt-reconciler"
EXEC_POLICY = "kubeckpt-reconciler-exec"


def rendered(cluster: LocalCluster, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The objects of these kinds in `kubectl kustomize config/default`."""
    out = cluster.kubectl("kustomize", str(REPO / "config" / "default")).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in kinds]


def policies(cluster: LocalCluster) -> list[dict[str, Any]]:
    return rendered(cluster, (POLICY, BINDING))


def with_progress_files(docs: list[dict[str, Any]], *paths: str) -> list[dict[str, Any]]:
    """`docs` with more paths the reconciler may read: KWOK runs an exec's command on the host, so
    a KWOK pod's progress file is at a host path, not at the one the webhook injects. The
    documented way for an admin to allow another TRAINING_PROGRESS_FILE."""
    docs = copy.deepcopy(docs)
    (policy,) = [d for d in docs if d["kind"] == POLICY and d["metadata"]["name"] == EXEC_POLICY]
    (var,) = [v for v in policy["spec"]["variables"] if v["name"] == "progressFiles"]
    files = json.loads(var["expression"].replace("'", '"')) + list(paths)
    var["expression"] = json.dumps(files)
    return docs


def install(cluster: LocalCluster, docs: list[dict[str, Any]]) -> None:
    """Apply the policies, then their bindings, and wait until the API server enforces them:
    its policy source reloads every policy and binding at once (about each second), so the
    last binding applied being enforced means all are. The probe is a server-side dry run of an
    Event the reconciler never writes, made in the reconciler's name (the admin impersonating
    it, with the masters group so that RBAC, whether its role is there or not, lets it by)."""
    cluster.apply([d for d in docs if d["kind"] == POLICY])
    bindings = [d for d in docs if d["kind"] == BINDING]
    events = [b for b in bindings if b["spec"]["policyName"] == "kubeckpt-reconciler-events"]
    cluster.apply([b for b in bindings if b not in events])
    cluster.apply(events)
    forged = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "policy-probe", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "x", "namespace": "default"},
        "reason": "Probe",
        "message": "probe",
        "source": {"component": "kubelet"},
    }

    def enforced() -> bool:
        proc = cluster.kubectl(
            "create",
            "--dry-run=server",
            f"--as={RECONCILER}",
            "--as-group=system:masters",
            "-f",
            "-",
            input=json.dumps(forged),
            check=False,
        )
        return proc.returncode != 0 and "ValidatingAdmissionPolicy" in proc.stderr

    wait_for(enforced, "the admission policies to be enforced", timeout=30)


def remove(cluster: LocalCluster, docs: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(docs), check=False
    )


def denied_by(proc: subprocess.CompletedProcess, policy: str) -> bool:
    """Whether a kubectl command failed because `policy` denied it (not RBAC, not anything else)."""
    return proc.returncode != 0 and f"ValidatingAdmissionPolicy '{policy}'" in proc.stderr
