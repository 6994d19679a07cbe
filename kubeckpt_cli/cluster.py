"""The reads the CLI makes, each wrapped so that a failure names its verb and resource.

TrainingProgress is reached through discovery first: a cluster without kubeckpt's CRDs then
says so plainly, where a bare GET would answer a 404 that reads like "job not found".
"""

from __future__ import annotations

from typing import Any

from kubeckpt_api.groupversion import TRAINING_PROGRESS
from kubeckpt_api.jobkinds import job_identity, job_kind
from reconciler.client import Client
from reconciler.errors import NotFound, ResourceNotFound
from reconciler.resources import EVENTS, PODS, Resource

from .connection import Target
from .errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError, api_call
from .view import clean

TP_API_VERSION = TRAINING_PROGRESS.api_version
TP_RESOURCE = TRAINING_PROGRESS.crd_name


class Cluster:
    def __init__(self, client: Client, target: Target) -> None:
        self.client = client
        self.target = target
        self._tp: Resource | None = None

    def call(self, verb: str, resource: str, namespace: str | None) -> Any:
        return api_call(verb, resource, namespace, self.target.server)

    async def tp_resource(self, namespace: str | None) -> Resource:
        if self._tp is None:
            # A miss (ResourceNotFound) becomes CRD_HINT in `translate`.
            with self.call("discover", TP_API_VERSION, namespace):
                self._tp = await self.client.resource(TP_API_VERSION, TRAINING_PROGRESS.plural)
        return self._tp

    async def find_progress(
        self, job: str, namespace: str, kind: str | None = None
    ) -> dict[str, Any]:
        """The TrainingProgress of the job named `job` (of `kind` when given), found by its
        spec.jobRef: a PyTorchJob and a TrainJob may share a name, and then their
        TrainingProgress objects do not (`llama`, `llama-trainjob`)."""
        items, _ = await self.list_progress(namespace)
        return choose_progress(items, job, namespace, kind)

    async def list_progress(
        self, namespace: str | None, name: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every TrainingProgress in `namespace` (None: all; `name`: that one if it exists),
        sorted, and the list's resourceVersion (to watch from)."""
        res = await self.tp_resource(namespace)
        selector = f"metadata.name={name}" if name else None
        with self.call("list", TP_RESOURCE, namespace):
            result = await self.client.api(res).list_all(namespace, field_selector=selector)
        items = sorted(
            result.items,
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        return items, result.resource_version

    async def job_pods(self, tp: dict[str, Any]) -> list[dict[str, Any]]:
        """The job's pods, found by the label its operator sets (the job kind's name label)."""
        ns = tp["metadata"]["namespace"]
        ref = (tp.get("spec") or {}).get("jobRef") or {}
        kind = job_kind(str(ref.get("kind", "")))
        name = str(ref.get("name") or tp["metadata"]["name"])
        if kind is None:
            return []
        with self.call("list", "pods", ns):
            result = await self.client.api(PODS).list_all(
                ns, label_selector=f"{kind.name_label}={name}"
            )
        pods = [p for p in result.items if _belongs(p, kind.kind, name)]
        return sorted(pods, key=lambda p: p["metadata"]["name"])

    async def get_pod(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            with self.call("get", "pods", namespace):
                return await self.client.api(PODS).get(name, namespace)
        except CliError as e:
            if e.code == EXIT_NOT_FOUND:
                return None
            raise

    async def job(self, tp: dict[str, Any]) -> dict[str, Any] | None:
        """The job object itself, or None when it is gone or its kind is not served here."""
        ns = tp["metadata"]["namespace"]
        ref = (tp.get("spec") or {}).get("jobRef") or {}
        kind = job_kind(str(ref.get("kind", "")))
        if kind is None:
            return None
        resource = f"{kind.plural}.{kind.group}"
        with self.call("get", resource, ns):
            try:
                res = await self.client.resource(kind.api_version, kind.plural)
                return await self.client.api(res).get(str(ref.get("name")), ns)
            except (NotFound, ResourceNotFound):  # the job is gone, or its operator's CRD
                return None

    async def events(self, tp: dict[str, Any]) -> list[dict[str, Any]]:
        """Events about the job and its TrainingProgress (the controller posts them on the job),
        oldest first."""
        ns = tp["metadata"]["namespace"]
        ref = (tp.get("spec") or {}).get("jobRef") or {}
        names = {str(ref.get("name") or tp["metadata"]["name"]), tp["metadata"]["name"]}
        kinds = {str(ref.get("kind", "")), TRAINING_PROGRESS.kind}
        found: list[dict[str, Any]] = []
        for name in sorted(names):
            with self.call("list", "events", ns):
                result = await self.client.api(EVENTS).list_all(
                    ns, field_selector=f"involvedObject.name={name}"
                )
            found += [
                e for e in result.items if (e.get("involvedObject") or {}).get("kind") in kinds
            ]
        return sorted(found, key=_event_time)


def _ref(tp: dict[str, Any]) -> tuple[str, str]:
    ref = (tp.get("spec") or {}).get("jobRef") or {}
    if not isinstance(ref, dict):
        return "", ""
    return str(ref.get("kind") or ""), str(ref.get("name") or "")


def choose_progress(
    items: list[dict[str, Any]], job: str, namespace: str, kind: str | None = None
) -> dict[str, Any]:
    """The one TrainingProgress among `items` (one namespace's) for the job named `job`: by
    spec.jobRef (kind and name), else, for an object whose jobRef names no job, by its own name
    (`kubectl get tp` shows those names). Several kinds' jobs of that name and no `kind`: a
    usage error that lists the kinds; none: not found."""
    by_ref = [tp for tp in items if _ref(tp)[1] == job and kind in (None, _ref(tp)[0])]
    if not by_ref:
        named = (tp for tp in items if tp["metadata"].get("name") == job)
        by_ref = [tp for tp in named if kind in (None, _ref(tp)[0])]
    kinds = sorted({_ref(tp)[0] or "?" for tp in by_ref})
    if len(kinds) > 1:
        raise CliError(
            f'several jobs are named "{clean(job)}" in namespace "{namespace}" '
            f"({', '.join(clean(k) for k in kinds)}): choose one with --kind",
            EXIT_USAGE,
        )
    if not by_ref:
        what = f"{clean(kind)} " if kind else "training job "
        raise CliError(
            f'no {what}"{clean(job)}" in namespace "{namespace}" (no TrainingProgress of that '
            "name): check -n, or list the jobs with `kubeckpt status -A`",
            EXIT_NOT_FOUND,
        )
    # Two of one kind: a deleted job's, about to be garbage-collected, and its successor's.
    return max(by_ref, key=lambda tp: str(tp["metadata"].get("creationTimestamp", "")))


def _belongs(pod: dict[str, Any], kind: str, name: str) -> bool:
    ident = job_identity((pod.get("metadata") or {}).get("labels") or {})
    return ident is not None and ident.kind == kind and ident.name == name


def _event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
