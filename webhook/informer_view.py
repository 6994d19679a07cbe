"""The webhook's ClusterView backed by the reconciler library's informers.

Three caches: Namespaces (for the opt-in label), CheckpointPolicies and TrainingProgress (for the
adaptive grace period, indexed by spec.jobRef). An admission request only reads them; the
informers keep them current.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from kubeckpt_api.groupversion import API_VERSION, CHECKPOINT_POLICY, TRAINING_PROGRESS
from kubeckpt_api.jobkinds import JobIdentity
from reconciler.client import Client
from reconciler.informer import Informer
from reconciler.transform import strip_bookkeeping

from .view import JOB_REF_INDEX, choose_progress, job_ref_index, job_ref_key


class InformerView:
    def __init__(self, client: Client) -> None:
        self._client = client
        self._informers: dict[str, Informer] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        specs = {
            "namespaces": ("v1", "namespaces"),
            "policies": (API_VERSION, CHECKPOINT_POLICY.plural),
            "progress": (API_VERSION, TRAINING_PROGRESS.plural),
        }
        for key, (api_version, plural) in specs.items():
            api = await self._client.api_for(api_version, plural)
            indexers = {JOB_REF_INDEX: job_ref_index} if key == "progress" else None
            # managedFields and kubectl's last-applied copy: never read, often most of the bytes.
            inf = Informer(
                api, name=f"webhook-{plural}", indexers=indexers, transform=strip_bookkeeping
            )
            self._informers[key] = inf
            self._tasks.append(asyncio.create_task(inf.run(), name=f"informer-{plural}"))

    async def wait_for_sync(self) -> None:
        await asyncio.gather(*(i.wait_for_sync() for i in self._informers.values()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    # --- ClusterView ---
    def synced(self) -> bool:
        return bool(self._informers) and all(i.has_synced for i in self._informers.values())

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return self._informers["namespaces"].store.get_by_name(name)

    def policies(self, namespace: str) -> list[Mapping[str, Any]]:
        return self._informers["policies"].store.list(namespace)

    def progress(
        self, namespace: str, job: JobIdentity, job_uid: str | None = None
    ) -> Mapping[str, Any] | None:
        key = job_ref_key(namespace, job.job_kind, job.name)
        return choose_progress(
            self._informers["progress"].store.by_index(JOB_REF_INDEX, key), job_uid
        )
