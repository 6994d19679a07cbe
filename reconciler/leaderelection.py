"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

A candidate takes the Lease when it is free (no holder) or when its record has not changed for
`leaseDurationSeconds` of the candidate's own monotonic clock (the holder's timestamps are never
compared with ours, so clock skew does not matter). The holder renews every `retry_period`; if it
cannot renew within `renew_deadline` of the last renewal it *sent*, it stops leading: the `lead`
coroutine is cancelled and awaited. Since renew_deadline < lease_duration, and a rival can only
take the Lease lease_duration after it saw that renewal (which it saw after it was sent), the old
leader has stopped before the rival starts. On orderly shutdown a leader releases the Lease
(holderIdentity cleared, leaseDurationSeconds 1, as client-go's ReleaseOnCancel), so a rival can
take over at once.

Defaults are client-go's: 15 s lease, 10 s renew deadline, 2 s retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .clock import REAL_CLOCK, Clock
from .errors import AlreadyExists, ApiError, Conflict, KubeError, NotFound
from .objects import KubeObject, micro_time
from .resources import LEASES

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Hostname (the pod name in a pod) plus a random suffix, as controller-runtime does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


@dataclass
class LeaderElectionConfig:
    lease_name: str
    lease_namespace: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # Acquisition retries wait retry_period * (1 + jitter * U[0, 1)). client-go uses 1.2; a
    # smaller factor makes takeover after a crash faster (lease duration + about one retry).
    jitter: float = 0.1
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if self.renew_deadline <= self.retry_period * (1 + self.jitter):
            raise ValueError("renew_deadline must exceed retry_period * (1 + jitter)")


class LeaderElector:
    def __init__(
        self,
        client: Client,
        config: LeaderElectionConfig,
        *,
        clock: Clock = REAL_CLOCK,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.api = client.api(LEASES)
        self._clock = clock
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._observed: dict[str, Any] = {}
        self._observed_time = 0.0
        self._observed_rv = ""
        self._leading = False
        self._last_renew_sent = 0.0
        self._reported_leader = ""
        self.acquisitions = 0

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def leader(self) -> str:
        """The holder in the last record we observed ("" if none)."""
        return str(self._observed.get("holderIdentity") or "")

    def renew_deadline_at(self) -> float:
        """Monotonic time by which the next renewal must succeed (while leading)."""
        return self._last_renew_sent + self.config.renew_deadline

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Campaign: acquire, run `lead()` while leading, cancel it on losing the Lease, and
        campaign again. Returns (releasing the Lease) when `lead` returns. Cancelling `run`
        cancels `lead`, waits for it, then releases the Lease. `lead` must honour cancellation
        promptly: the time it takes eats into the lease_duration - renew_deadline margin."""
        try:
            while True:
                await self._acquire()
                if not await self._lead_while_renewing(lead):
                    return
        finally:
            if self._leading and self.config.release_on_cancel:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.config.retry_period * 2):
                        await self.release()
            self._set_leading(False)

    async def _acquire(self) -> None:
        c = self.config
        while not await self._try(within=c.renew_deadline):
            await self._clock.sleep(c.retry_period * (1 + c.jitter * random.random()))

    async def _lead_while_renewing(self, lead: Callable[[], Awaitable[None]]) -> bool:
        """Lead until the Lease is lost (True) or `lead` finishes (False, or its exception)."""
        self._set_leading(True)
        lead_task = asyncio.create_task(lead(), name=f"lead:{self.config.lease_name}")
        renew_task = asyncio.create_task(self._renew_until_lost())
        try:
            done, _ = await asyncio.wait(
                {lead_task, renew_task}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            # Stop leading *before* the Lease can be taken: cancel `lead` and wait for it.
            lead_task.cancel()
            renew_task.cancel()
            await asyncio.gather(lead_task, renew_task, return_exceptions=True)
        if renew_task in done:
            log.warning("%s: lost lease %s", self.identity, self.config.lease_name)
            self._set_leading(False)
            return True
        await self.release()
        self._set_leading(False)
        lead_task.result()  # re-raise what `lead` raised
        return False

    async def _renew_until_lost(self) -> None:
        """Return when a renewal could not be made within the renew deadline."""
        c = self.config
        while True:
            await self._clock.sleep(c.retry_period)
            while True:
                remaining = self.renew_deadline_at() - self._clock.now()
                if remaining <= 0:
                    return
                if await self._try(within=remaining):
                    break
                if self._observed.get("holderIdentity") not in (None, "", self.identity):
                    return  # someone else holds it (our record was overwritten)
                left = self.renew_deadline_at() - self._clock.now()
                await self._clock.sleep(min(c.retry_period, left))

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        cb = self._on_started if leading else self._on_stopped
        if cb is not None:
            cb()

    async def _try(self, within: float) -> bool:
        """client-go's tryAcquireOrRenew; False on any failure (logged)."""
        sent = self._clock.now()
        try:
            async with asyncio.timeout(within):
                ok = await self._try_acquire_or_renew(sent)
        except (TimeoutError, KubeError) as e:
            log.info("%s: lease %s: %s", self.identity, self.config.lease_name, e or "timed out")
            return False
        if ok:
            self._last_renew_sent = sent
        return ok

    def _record(self, spec: dict[str, Any]) -> dict[str, Any]:
        keys = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime")
        return {k: spec.get(k) for k in (*keys, "leaseTransitions")}

    def _observe(self, record: dict[str, Any], rv: str) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_time = self._clock.now()
        self._observed_rv = rv
        holder = str(record.get("holderIdentity") or "")
        if holder and holder != self._reported_leader:
            self._reported_leader = holder
            if self._on_new_leader is not None:
                self._on_new_leader(holder)

    async def _try_acquire_or_renew(self, sent: float) -> bool:
        c = self.config
        now = micro_time()
        mine = {
            "holderIdentity": c.identity,
            "leaseDurationSeconds": int(c.lease_duration),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        try:
            lease = await self.api.get(c.lease_name, c.lease_namespace)
        except NotFound:
            body: KubeObject = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": c.lease_name, "namespace": c.lease_namespace},
                "spec": mine,
            }
            try:
                created = await self.api.create(body)
            except AlreadyExists:
                return False
            self._observe(self._record(created["spec"]), created["metadata"]["resourceVersion"])
            self._observed_time = sent
            return True
        old = self._record(lease.get("spec") or {})
        self._observe(old, lease["metadata"]["resourceVersion"])
        holder = old.get("holderIdentity") or ""
        duration = old.get("leaseDurationSeconds") or c.lease_duration
        if holder and holder != c.identity and self._observed_time + duration > self._clock.now():
            return False  # held by another, and not expired by our clock
        if holder == c.identity:
            mine["acquireTime"] = old.get("acquireTime") or now
            mine["leaseTransitions"] = old.get("leaseTransitions") or 0
        else:
            mine["leaseTransitions"] = (old.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**(lease.get("spec") or {}), **mine}
        try:
            updated = await self.api.replace(lease)
        except Conflict:
            return False  # someone else wrote it first; re-read next time
        except ApiError as e:
            log.info("%s: updating lease: %s", c.identity, e)
            return False
        if holder != c.identity:
            self.acquisitions += 1
        self._observe(self._record(updated["spec"]), updated["metadata"]["resourceVersion"])
        self._observed_time = sent
        return True

    async def release(self) -> bool:
        """Give the Lease up if we hold it (holder cleared, leaseDurationSeconds 1)."""
        c = self.config
        try:
            lease = await self.api.get(c.lease_name, c.lease_namespace)
        except KubeError as e:
            log.info("%s: release: %s", c.identity, e)
            return False
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != c.identity:
            return True
        now = micro_time()
        lease["spec"] = {
            **spec,
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            await self.api.replace(lease)
        except KubeError as e:
            log.info("%s: release: %s", c.identity, e)
            return False
        log.info("%s: released lease %s", c.identity, c.lease_name)
        return True
