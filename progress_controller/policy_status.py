"""CheckpointPolicy status: whether the webhook can use each policy, in `kubectl get cpol`.

A policy the webhook cannot parse, or one that an older policy always beats, leaves pods without
checkpoints and says so only in an admission warning that nobody reads; its status says it where
the author looks. The decision (`policy_status`) is pure: the webhook's own parser
(`kubeckpt_api.policy.policy_from_object`) and its own choice among policies
(`kubeckpt_api.optin.select_policy`: the oldest matching one wins) decide, so the
status cannot disagree with what admission does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubeckpt_api.groupversion import CHECKPOINT_POLICY
from kubeckpt_api.optin import INJECT_LABEL, NAMESPACE_OPT_IN, policy_precedence_key
from kubeckpt_api.policy import policy_from_object
from kubeckpt_api.status import set_condition
from reconciler.apply import apply_status, status_patch
from reconciler.controller import Request, Result, generation_changed
from reconciler.errors import Conflict, NotFound
from reconciler.informer import Informer
from reconciler.manager import Manager
from reconciler.objects import KubeObject, name_of, namespace_of

from .decide import FIELD_MANAGER

READY = "Ready"


def _selects_all(obj: KubeObject) -> bool:
    sel = (obj.get("spec") or {}).get("selector") or {}
    return not sel.get("matchLabels") and not sel.get("matchExpressions")


def policy_status(
    policy: KubeObject,
    siblings: list[KubeObject],
    namespace: KubeObject | None,
    prev: dict[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The status for `policy`, given the other policies of its namespace and the namespace."""
    md = policy.get("metadata") or {}
    generation = int(md.get("generation") or 0)
    conds: list[dict[str, Any]] = list((prev or {}).get("conditions") or [])
    ns = namespace_of(policy)
    try:
        policy_from_object(policy)
    except ValueError as e:  # ContractError is a ValueError; what mutation catches
        status, reason = "False", "Invalid"
        message = f"the webhook ignores this policy (pods stay without checkpoints): {e}"
    else:
        older = sorted(
            (
                p
                for p in siblings
                if name_of(p) != name_of(policy)
                and not (p.get("metadata") or {}).get("deletionTimestamp")
                and _selects_all(p)
                and policy_precedence_key(p) < policy_precedence_key(policy)
            ),
            key=policy_precedence_key,
        )
        if older:
            status, reason = "False", "Shadowed"
            message = (
                f"CheckpointPolicy {name_of(older[0])} is older and selects every training pod "
                "of the namespace: the oldest matching policy is the one applied, so this one "
                "never is"
            )
        else:
            status, reason = "True", "Valid"
            scope = (
                "every training pod"
                if _selects_all(policy)
                else "training pods whose labels match spec.selector"
            )
            labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
            if labels.get(INJECT_LABEL) == NAMESPACE_OPT_IN:
                message = f"applied to {scope} created in namespace {ns}"
            else:
                message = (
                    f"applied to {scope} created in namespace {ns} that carry the label "
                    f"{INJECT_LABEL}=true; label the namespace {INJECT_LABEL}={NAMESPACE_OPT_IN} "
                    "to cover all of them"
                )
    conds = set_condition(conds, READY, status, reason, message, now)
    for c in conds:
        if c["type"] == READY:
            c["observedGeneration"] = generation
    return {"observedGeneration": generation, "conditions": conds}


class PolicyStatusController:
    """Writes each CheckpointPolicy's status when its outcome changes (leader only)."""

    def __init__(
        self,
        manager: Manager,
        policies: Informer,
        namespaces: Informer,
    ) -> None:
        self.api = policies.api
        self.policies = policies
        self.namespaces = namespaces
        self.writes = 0
        self.controller = manager.controller("policy-status", self.reconcile)
        # Any policy's change can shadow or free its siblings: reconcile the whole namespace. Our
        # status writes come back as updates and must not loop; spec edits bump generation, and a
        # policy being deleted no longer shadows the others.
        self.controller.watch(
            policies,
            self._namespace_policies,
            update_predicate=partial(generation_changed, deletion=True),
        )
        self.controller.watch(
            namespaces, self._policies_of_namespace, update_predicate=_labels_changed
        )

    def _namespace_policies(self, obj: KubeObject) -> list[Request]:
        return [Request.from_object(p) for p in self.policies.store.list(namespace_of(obj))]

    def _policies_of_namespace(self, ns: KubeObject) -> list[Request]:
        return [Request.from_object(p) for p in self.policies.store.list(name_of(ns))]

    async def reconcile(self, req: Request) -> Result | None:
        policy = self.policies.store.get(req.key)
        if policy is None:
            return None
        prev = policy.get("status") or {}
        new = policy_status(
            policy,
            self.policies.store.list(req.namespace),
            self.namespaces.store.get(req.namespace),
            prev,
            datetime.now(UTC),
        )
        if new == {k: prev.get(k) for k in new}:
            return None
        body = status_patch(
            CHECKPOINT_POLICY.api_version, CHECKPOINT_POLICY.kind, req.name, req.namespace, new
        )
        try:
            await apply_status(self.api, body, field_manager=FIELD_MANAGER, force=True)
        except NotFound:
            return None  # deleted meanwhile; its delete event needs nothing
        except Conflict as e:
            logging.getLogger("kubeckpt.policy").warning("%s: status apply: %s", req.key, e)
            raise
        self.writes += 1
        return None


def _labels_changed(old: KubeObject, new: KubeObject) -> bool:
    return (old.get("metadata") or {}).get("labels") != (new.get("metadata") or {}).get("labels")
