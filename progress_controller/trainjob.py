"""TrainJob (Kubeflow Trainer v2) support: noticing the CRD when it is installed later, and
`status.trainerStatus` in upstream's shape (KEP-2779: progressPercentage and
estimatedRemainingSeconds as int32, metrics as [{name, value}] strings, lastUpdatedTime), applied
only when the CRD has that field and without force, so a field another manager owns is left to
it (a Conflict). A PyTorchJob's status is never written.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from kubeckpt_api import status_bounds as bounds
from kubeckpt_api.jobkinds import TRAINJOB
from reconciler.errors import ApiError, ResourceNotFound
from reconciler.informer import Informer
from reconciler.objects import KubeObject
from reconciler.resources import Resource
from trainer_runtime.contract.env import KUBECKPT_PROGRESS_PUSH_URL

log = logging.getLogger("kubeckpt.progress.trainjob")

TRAINJOB_API_VERSION = TRAINJOB.api_version
TRAINJOB_CRD = f"{TRAINJOB.plural}.{TRAINJOB.group}"
# Set by Trainer in the `node` containers when its TrainJobStatus gate is on: its own status
# server (which transformers' KubeflowCallback posts to) then owns status.trainerStatus.
TRAINER_SERVER_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
INT32_MAX = 2**31 - 1
_METRICS = (
    ("loss", "loss"),
    ("learningRate", "learning_rate"),
    ("accuracy", "accuracy"),
    ("validationLoss", "eval_loss"),
    ("validationAccuracy", "eval_accuracy"),
    ("epoch", "currentEpoch"),
    ("totalEpochs", "totalEpochs"),
    ("step", "currentStep"),
    ("totalSteps", "totalSteps"),
)


def crd_has_trainer_status(crd: KubeObject | None, version: str = "v1alpha1") -> bool:
    """Whether the TrainJob CRD's schema (served `version`) has status.trainerStatus."""
    for v in ((crd or {}).get("spec") or {}).get("versions") or []:
        if v.get("name") != version:
            continue
        schema = ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
        status = (schema.get("properties") or {}).get("status") or {}
        return "trainerStatus" in (status.get("properties") or {})
    return False


def trainer_status(tp_status: dict[str, Any]) -> dict[str, Any] | None:
    """Our TrainingProgress status in Trainer's shape; None when there is nothing to say."""
    if tp_status.get("step") is None:
        return None
    out: dict[str, Any] = {}
    # The status holds only values in range (decide, status_bounds); one an older controller
    # wrote is fitted to Trainer's schema here.
    try:
        pct = float(tp_status.get("percentComplete", "nan"))
        if math.isfinite(pct):
            out["progressPercentage"] = max(0, min(100, int(pct)))
    except ValueError:
        pass
    seconds = bounds.eta_seconds(tp_status.get("estimatedTimeRemaining"))
    if seconds is not None:
        out["estimatedRemainingSeconds"] = min(INT32_MAX, int(seconds))
    metrics = [
        {"name": name, "value": str(tp_status[key])}
        for key, name in _METRICS
        if tp_status.get(key) not in (None, "")
    ]
    if metrics:
        out["metrics"] = metrics
    out["lastUpdatedTime"] = tp_status.get("lastUpdateTime") or tp_status.get("lastPollTime")
    return out


def trainer_status_server(container: dict[str, Any]) -> bool:
    """Whether Trainer's status server reports this pod's progress (gate TrainJobStatus on): its
    URL is set and is not the one our webhook injected for push (then it equals ours)."""
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    if TRAINER_SERVER_ENV not in env:
        return False
    return env[TRAINER_SERVER_ENV] != env.get(KUBECKPT_PROGRESS_PUSH_URL, object())


class TrainJobWatcher:
    """Notices the TrainJob API (discovery, every `interval` seconds) without a restart, then
    runs an informer on it and calls `on_informer` once; re-reads whether the CRD has
    status.trainerStatus on each round (it may be upgraded)."""

    def __init__(
        self,
        client: Any,
        on_informer: Callable[[Informer], None],
        *,
        interval: float = 30.0,
    ) -> None:
        self.client = client
        self.on_informer = on_informer
        self.interval = interval
        self.informer: Informer | None = None
        self.api: Any = None
        self.has_trainer_status = False

    async def _round(self) -> None:
        if self.informer is None:
            try:
                res = await self.client.resource(TRAINJOB_API_VERSION, TRAINJOB.plural)
            except (ResourceNotFound, ApiError):
                return
            self.api = self.client.api(res)
            self.informer = Informer(self.api, name="trainjobs")
            self.on_informer(self.informer)
            self._task = asyncio.create_task(self.informer.run(), name="informer:trainjobs")
            log.info("TrainJob API found: watching TrainJobs")
        try:
            crd = await self.client.api(CRDS).get(TRAINJOB_CRD)
        except ApiError:
            crd = None
        self.has_trainer_status = crd_has_trainer_status(crd)

    async def run(self) -> None:
        try:
            while True:
                await self._round()
                await asyncio.sleep(self.interval)
        finally:
            if self.informer is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
