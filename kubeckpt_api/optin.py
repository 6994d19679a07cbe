"""Which pods kubeckpt injects: the opt-in labels, the marker, and which CheckpointPolicy applies
(DESIGN.md, "Pods"). The webhook decides with these at admission; the progress controller asks
the same question of a pod the webhook missed (NotInjected) and orders policies the same way for
their status (which one shadows which); the CLI reads the marker. No pod reads them, so they are
not in trainer_runtime.contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Every label and annotation of ours starts with it (per-job overrides: kubeckpt.io/<field>).
ANNOTATION_PREFIX = "kubeckpt.io/"
INJECT_LABEL = "kubeckpt.io/inject"
INJECTED_LABEL = "kubeckpt.io/injected"
STATUS_ANNOTATION = "kubeckpt.io/status"
# The progress push endpoint's CA, which the webhook stamps on push pods for them to read
# (webhook/push_injection.py); nothing else reads it.
PUSH_CA_ANNOTATION = "kubeckpt.io/progress-push-ca"
NAMESPACE_OPT_IN = "enabled"


def opted_in(pod_labels: Mapping[str, str], namespace: Mapping[str, Any] | None) -> bool:
    """The pod label wins either way; else the namespace label decides."""
    choice = pod_labels.get(INJECT_LABEL)
    if choice is not None:
        return choice.strip().lower() == "true"
    ns_labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    return ns_labels.get(INJECT_LABEL) == NAMESPACE_OPT_IN


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector matches everything."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an unknown operator matches nothing, as in the API machinery
    return True


def policy_precedence_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """Sort key of CheckpointPolicies, first the one that wins: the oldest (creationTimestamp,
    RFC 3339 in UTC, so it sorts as text), ties broken by name. The webhook's choice
    (`select_policy`) and the policy status (which policy shadows which) both order by it."""
    md = obj.get("metadata") or {}
    return (str(md.get("creationTimestamp", "")), str(md.get("name", "")))


def select_policy(
    policies: Iterable[Mapping[str, Any]], labels: Mapping[str, str]
) -> tuple[Mapping[str, Any] | None, list[str]]:
    """The oldest matching policy (ties broken by name), and warnings about unusable ones."""
    matching = []
    warnings = []
    for obj in policies:
        spec = obj.get("spec") or {}
        if obj.get("metadata", {}).get("deletionTimestamp"):
            continue
        if selector_matches(spec.get("selector") or {}, labels):
            matching.append(obj)
    matching.sort(key=policy_precedence_key)
    if len(matching) > 1:
        names = ", ".join(o["metadata"]["name"] for o in matching)
        warnings.append(f"kubeckpt: several CheckpointPolicies match ({names}); the oldest wins")
    return (matching[0] if matching else None), warnings
