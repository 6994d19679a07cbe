"""Certificates for an admission webhook's TLS server (what open-policy-agent's cert-controller
rotator does for Go operators; nothing here is particular to one webhook: its names come in
`CertConfig`).

Two modes, one server-facing object (`ServingTLS`: a hot-reloaded `ssl.SSLContext`, readiness, and
change notification):

- self-managed (default), `CertManager`: the webhook keeps a CA and a serving certificate in a
  Secret, writes the CA bundle into the MutatingWebhookConfiguration's caBundle, and renews before
  expiry. Several replicas share the Secret.
- cert-manager, `FileCertSource` (mounted_files): serve the mounted `tls.crt` and
  `tls.key` and reload them when the kubelet swaps the volume.

The Secret (type kubernetes.io/tls) holds:

    tls.crt, tls.key  the serving certificate and key (every replica serves this one)
    ca.crt            the CA bundle, as written into caBundle: the current CA, during a CA rotation
                      the next CA too, and after a rotation the previous CA until it expires
    ca.key            the key of the CA that signs serving certificates (any replica can re-issue)
    ca-next.key       during a CA rotation only: the next CA's key (its certificate is in ca.crt)

Rotation without dropping requests:

- The serving certificate is renewed when less than `renew_fraction` (1/3) of its lifetime remains;
  the CA lives much longer, so a serving renewal leaves caBundle as it is.
- The CA is rotated in two steps when less than `ca_renew_fraction` of its lifetime remains: first
  a new CA is added to ca.crt and published to caBundle (serving certificates are still signed by
  the old CA, which the bundle still holds). Once a replica has seen the new CA in every webhook
  entry's caBundle for `ca_publish_grace` (time for every API server to pick the change up), the
  new CA becomes the signer and a serving certificate signed by it is issued. The old CA stays in
  the bundle until it expires, so replicas that have not reloaded yet stay trusted.

Several replicas, one Secret (optimistic concurrency, no leader needed):

- Create-if-absent: a 409 on create means another replica won; we read and adopt its Secret.
- Updates carry the resourceVersion they were computed from. On 409 we re-read and decide again
  from the newer Secret: a valid certificate another replica wrote is adopted, never overwritten.
- The caBundle patch is a JSON patch with a `test` of the configuration's resourceVersion, and every
  pass reads the configuration *before* the Secret. So a replica holding a Secret older than the
  bundle already published cannot write that older bundle back: the publisher updated the Secret
  before patching the configuration, so either we read the newer Secret, or the configuration
  changed after we read it and our patch's test fails.
- Every replica re-reads the Secret every `resync_interval` (a GET, not a watch) and serves what it
  holds. A GET every 30 s per replica is nothing for the API server; it needs no reconnect,
  resourceVersion or bookmark handling; and it also drives the expiry checks, which need a timer
  anyway. Latency is harmless by construction: a renewed certificate is written with a third of the
  old one's lifetime to spare, and after a CA switch the old CA stays in caBundle.

RBAC the webhook's ServiceAccount needs: Secrets get/create/update in its namespace (create cannot
be limited by name; get/update can, to the Secret's name), and mutatingwebhookconfigurations
get/patch on the configuration's name.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from .. import pki
from ..pki import CertificateError, CertInfo, KeyPair
from .secret_store import Conflict, SecretStore, StoreError
from .serving_tls import ServingTLS

__all__ = ["CertConfig", "CertManager", "Plan", "ReconcileResult", "plan_secret"]

log = logging.getLogger(__name__)

TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_BUNDLE = "ca.crt"
CA_KEY = "ca.key"
CA_NEXT_KEY = "ca-next.key"
MANAGED_KEYS = (TLS_CERT, TLS_KEY, CA_BUNDLE, CA_KEY, CA_NEXT_KEY)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class CertConfig:
    """Self-managed certificate settings.

    `service`/`namespace` name the webhook's Service: the serving certificate covers
    `<service>.<namespace>.svc` and `<service>.<namespace>.svc.cluster.local`, plus
    `extra_dns_names` and `extra_ip_addresses` (e.g. 127.0.0.1 for a URL-registered local webhook).
    `webhook_config_name` is the MutatingWebhookConfiguration whose every entry gets the CA bundle;
    None leaves caBundle to someone else.
    """

    service: str
    namespace: str
    secret_name: str = "webhook-server-cert"
    webhook_config_name: str | None = None
    extra_dns_names: tuple[str, ...] = ()
    extra_ip_addresses: tuple[str, ...] = ()
    serving_validity: dt.timedelta = dt.timedelta(days=90)
    ca_validity: dt.timedelta = dt.timedelta(days=3 * 365)
    renew_fraction: float = 1 / 3
    ca_renew_fraction: float = 1 / 3
    ca_publish_grace: dt.timedelta = dt.timedelta(seconds=30)
    backdate: dt.timedelta = dt.timedelta(minutes=5)
    resync_interval: float = 30.0
    ca_name: str = "webhook-ca"
    # Labels of the Secret when this replica creates it (an existing Secret's are left alone).
    secret_labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("renew_fraction", "ca_renew_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be between 0 and 1")
        if self.serving_validity >= self.ca_validity:
            raise ValueError("the CA must outlive the serving certificate")
        if self.serving_validity * self.renew_fraction >= self.ca_validity * self.ca_renew_fraction:
            raise ValueError(
                "CA rotation must start while the old CA can still sign a serving certificate "
                "that lives a renewal period: raise ca_validity or ca_renew_fraction"
            )
        if self.resync_interval <= 0:
            raise ValueError("resync_interval must be positive")

    @property
    def dns_names(self) -> tuple[str, ...]:
        base = f"{self.service}.{self.namespace}.svc"
        names = [base, f"{base}.cluster.local"]
        return tuple(dict.fromkeys([*names, *self.extra_dns_names]))

    @property
    def ip_addresses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.extra_ip_addresses))


# --- the decision: a pure function of (Secret data, config, now, what is published) ---


@dataclass(frozen=True)
class _CA:
    cert: x509.Certificate
    key_pem: bytes

    @property
    def pair(self) -> KeyPair:
        return KeyPair(pki.cert_pem(self.cert), self.key_pem)


@dataclass
class _State:
    bundle: list[x509.Certificate] = field(default_factory=list)
    signer: _CA | None = None
    pending: _CA | None = None
    serving: x509.Certificate | None = None


def _ca_for(key_pem: bytes | None, bundle: Sequence[x509.Certificate]) -> _CA | None:
    if not key_pem:
        return None
    try:
        key = pki.load_private_key(key_pem)
    except CertificateError:
        return None
    for cert in bundle:
        if pki.is_ca(cert) and pki.key_matches(cert, key):
            return _CA(cert, key_pem)
    return None


def _parse(data: Mapping[str, bytes]) -> _State:
    """Whatever is usable in the Secret's data; anything malformed counts as absent."""
    st = _State()
    try:
        st.bundle = pki.load_certs(data.get(CA_BUNDLE, b""))
    except CertificateError:
        st.bundle = []
    st.signer = _ca_for(data.get(CA_KEY), st.bundle)
    st.pending = _ca_for(data.get(CA_NEXT_KEY), st.bundle)
    if st.pending is not None and st.signer is not None and st.pending.cert == st.signer.cert:
        st.pending = None
    try:
        st.serving = pki.check_pair(data.get(TLS_CERT, b""), data.get(TLS_KEY, b""))
    except CertificateError:
        st.serving = None
    return st


@dataclass(frozen=True)
class Plan:
    """The Secret's next data (None: keep it as it is) and what changed, for logs and tests."""

    data: dict[str, bytes] | None
    actions: tuple[str, ...] = ()


def plan_secret(
    data: Mapping[str, bytes] | None,
    config: CertConfig,
    now: dt.datetime,
    *,
    ca_published: Callable[[x509.Certificate], bool] = lambda _: True,
    rotate_ca: bool = False,
    renew_serving: bool = False,
) -> Plan:
    """Decide what the Secret should hold at `now`.

    `ca_published(ca)` says whether the next CA has been in every caBundle long enough for the
    serving certificate to switch to it. `rotate_ca` starts a CA rotation now (unless one is under
    way); `renew_serving` issues a new serving certificate now.
    """
    data = data or {}
    st = _parse(data)
    actions: list[str] = []

    def new_ca() -> _CA:
        kp = pki.make_ca(
            config.ca_name, now=now, validity=config.ca_validity, backdate=config.backdate
        )
        return _CA(kp.cert, kp.key_pem)

    def alive(ca: _CA | None) -> _CA | None:
        return ca if ca is not None and ca.cert.not_valid_after_utc > now else None

    signer, pending = alive(st.signer), alive(st.pending)
    previous: list[x509.Certificate] = []
    if signer is None:
        if pending is not None:
            signer, pending = pending, None
            actions.append("CA switched: the signing CA is missing or expired")
        else:
            signer = new_ca()
            actions.append("CA created")
    elif pending is not None:
        if ca_published(pending.cert):
            previous.append(signer.cert)
            signer, pending = pending, None
            actions.append("CA switched: the new CA is published in caBundle")
        elif pki.remaining(signer.cert, now) < config.serving_validity * config.renew_fraction:
            previous.append(signer.cert)
            signer, pending = pending, None
            actions.append("CA switched before publication: the old CA is about to expire")
    elif rotate_ca or pki.renewal_due(signer.cert, now, config.ca_renew_fraction):
        pending = new_ca()
        actions.append("CA rotation started: new CA added to the bundle")

    # The bundle: the newest earlier CA still valid (replicas may still serve its certificates),
    # the signing CA, and the next CA during a rotation. Expired and older CAs are dropped.
    current = {pki.fingerprint(signer.cert)}
    if pending is not None:
        current.add(pki.fingerprint(pending.cert))
    earlier = [
        c
        for c in [*st.bundle, *previous]
        if pki.is_ca(c) and c.not_valid_after_utc > now and pki.fingerprint(c) not in current
    ]
    earlier.sort(key=lambda c: c.not_valid_before_utc)
    bundle = [*earlier[-1:], signer.cert, *([pending.cert] if pending else [])]

    want_dns, want_ips = set(config.dns_names), set(config.ip_addresses)
    serving = st.serving
    reason = None
    dns, ips = list(config.dns_names), list(config.ip_addresses)
    if renew_serving:
        reason = "renewal requested"
    elif serving is None:
        reason = "none usable in the Secret"
    elif not pki.issued_by(serving, signer.cert):
        reason = "not signed by the current CA"
    else:
        have_dns, have_ips = pki.sans_of(serving)
        if not (want_dns <= have_dns and want_ips <= have_ips):
            reason = "names missing"
            # Keep the names it has: two replicas configured with different extra names (a
            # rolling update) then converge on the union instead of re-issuing in turns.
            dns += sorted(have_dns - want_dns)
            ips += sorted(have_ips - want_ips)
        elif pki.renewal_due(serving, now, config.renew_fraction):
            reason = "renewal due"
    new: dict[str, bytes] = {k: v for k, v in data.items() if k not in MANAGED_KEYS}
    if reason is None:
        new[TLS_CERT], new[TLS_KEY] = data[TLS_CERT], data[TLS_KEY]
    else:
        kp = pki.issue_serving(
            signer.pair,
            dns_names=dns,
            ip_addresses=ips,
            now=now,
            validity=config.serving_validity,
            backdate=config.backdate,
        )
        new[TLS_CERT], new[TLS_KEY] = kp.cert_pem, kp.key_pem
        actions.append(f"serving certificate issued: {reason}")
    new[CA_BUNDLE] = pki.bundle_pem(bundle)
    new[CA_KEY] = signer.key_pem
    if pending is not None:
        new[CA_NEXT_KEY] = pending.key_pem
    if new == dict(data):
        return Plan(None)
    if not actions:
        actions.append("CA bundle pruned")
    return Plan(new, tuple(actions))


# --- the Secret and the webhook configuration through the store ---


def decode_secret_data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for k, v in ((secret or {}).get("data") or {}).items():
        try:
            out[k] = base64.b64decode(v or "", validate=True)
        except (binascii.Error, ValueError, TypeError):
            continue
    return out


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


def _bundle_fingerprints(ca_bundle_b64: str | None) -> set[str]:
    try:
        return {pki.fingerprint(c) for c in pki.load_certs(base64.b64decode(ca_bundle_b64 or ""))}
    except (CertificateError, binascii.Error, ValueError):
        return set()


@dataclass(frozen=True)
class ReconcileResult:
    """The outcome of one `CertManager.reconcile()`."""

    actions: tuple[str, ...]  # what this replica changed in the Secret (empty: adopted as is)
    wrote_secret: bool  # this replica created or updated the Secret
    created_secret: bool
    conflicts: int  # writes that lost a race (409 / failed test), each followed by a re-read
    published: bool  # this replica patched caBundle in the webhook configuration
    resource_version: str  # of the Secret now served
    serving: CertInfo
    ca_bundle: bytes
    rotation_pending: bool  # a next CA is in the bundle, not yet signing
    publish_error: str | None = None  # reading or patching the webhook configuration failed


class CertManager:
    """Self-managed certificates shared by all replicas through one Secret.

    `await reconcile()` makes one pass: read the webhook configuration and the Secret, create or
    renew what is due (optimistic concurrency), load the Secret's certificate into `tls`, publish
    the CA bundle. `await run()` repeats it every `config.resync_interval` seconds (with jitter,
    sooner when a renewal or a CA switch is near) until cancelled; errors are logged and retried
    with backoff, and the certificate already loaded keeps being served.

    `clock` returns the current time (timezone-aware UTC); tests pass a fake one.
    """

    def __init__(
        self,
        store: SecretStore,
        config: CertConfig,
        tls: ServingTLS | None = None,
        *,
        clock: Callable[[], dt.datetime] = utcnow,
        max_attempts: int = 6,
    ) -> None:
        self.store = store
        self.config = config
        self.tls = tls if tls is not None else ServingTLS()
        self.clock = clock
        self.max_attempts = max_attempts
        self.last_result: ReconcileResult | None = None
        self.last_error: str | None = None
        # fingerprint of a next CA -> when this replica first saw it in every caBundle
        self._published_since: dict[str, dt.datetime] = {}
        self._wake = asyncio.Event()
        self._mwc_missing = False

    # --- one pass ---
    async def reconcile(
        self,
        *,
        now: dt.datetime | None = None,
        rotate_ca: bool = False,
        renew_serving: bool = False,
    ) -> ReconcileResult:
        cfg = self.config
        now = now or self.clock()
        actions: list[str] = []
        wrote = created = False
        conflicts = 0
        first_seen: _State | None = None
        for _ in range(self.max_attempts):
            # The configuration first, then the Secret: see the module docstring.
            mwc, publish_error = await self._get_webhook_configuration()
            secret = await self.store.get_secret(cfg.namespace, cfg.secret_name)
            data = decode_secret_data(secret)
            state = _parse(data)
            if first_seen is None:
                first_seen = state
            # A forced renewal or rotation still applies after a lost race only if the winner did
            # not already do it: never replace a certificate another replica has just written.
            force_serving = renew_serving and not wrote and _same_serving(first_seen, state)
            force_ca = (
                rotate_ca and not wrote and state.pending is None and _same_ca(first_seen, state)
            )
            plan = plan_secret(
                data,
                cfg,
                now,
                ca_published=lambda ca, mwc=mwc: self._is_published(mwc, ca, now),
                rotate_ca=force_ca,
                renew_serving=force_serving,
            )
            if plan.data is not None:
                try:
                    secret, just_created = await self._write(secret, plan.data)
                except Conflict as e:
                    conflicts += 1
                    log.info("certificate Secret changed under us (%s); re-reading", e)
                    continue
                created = created or just_created
                wrote = True
                actions += plan.actions
                for a in plan.actions:
                    log.info("certificate Secret %s/%s: %s", cfg.namespace, cfg.secret_name, a)
            assert secret is not None
            new_data = decode_secret_data(secret)
            if not {TLS_CERT, TLS_KEY, CA_BUNDLE} <= new_data.keys():
                raise CertificateError(f"Secret {cfg.namespace}/{cfg.secret_name} lacks {TLS_CERT}")
            self.tls.load(new_data[TLS_CERT], new_data[TLS_KEY], new_data[CA_BUNDLE])
            try:
                published = await self._publish(mwc, new_data[CA_BUNDLE], now)
            except Conflict as e:
                conflicts += 1
                log.info("webhook configuration changed under us (%s); re-reading", e)
                continue
            except StoreError as e:
                # Serving goes on without it; a CA switch waits until publishing works again.
                log.warning("caBundle not published: %s", e)
                published, publish_error = False, str(e)
            info = self.tls.info
            assert info is not None
            result = ReconcileResult(
                actions=tuple(actions),
                wrote_secret=wrote,
                created_secret=created,
                conflicts=conflicts,
                published=published,
                resource_version=str((secret.get("metadata") or {}).get("resourceVersion", "")),
                serving=info,
                ca_bundle=new_data[CA_BUNDLE],
                rotation_pending=CA_NEXT_KEY in new_data,
                publish_error=publish_error,
            )
            self.last_result = result
            return result
        raise Conflict(f"gave up after {conflicts} conflicting writes in a row")

    async def _write(
        self, secret: dict[str, Any] | None, data: Mapping[str, bytes]
    ) -> tuple[dict[str, Any], bool]:
        """Create or update the Secret; returns it and whether it was created."""
        cfg = self.config
        if secret is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": cfg.secret_name,
                    "namespace": cfg.namespace,
                    "labels": dict(cfg.secret_labels),
                },
                "type": "kubernetes.io/tls",
                "data": _encode(data),
            }
            return await self.store.create_secret(cfg.namespace, body), True
        body = copy.deepcopy(secret)
        body["data"] = _encode(data)
        rv = str(body["metadata"]["resourceVersion"])
        updated = await self.store.update_secret(
            cfg.namespace, cfg.secret_name, body, resource_version=rv
        )
        return updated, False

    async def _get_webhook_configuration(self) -> tuple[dict[str, Any] | None, str | None]:
        """The configuration (None when not configured, absent or unreadable) and the error that
        made it unreadable. Certificates do not depend on it: only publishing and the CA switch
        (which then waits) do."""
        name = self.config.webhook_config_name
        if name is None:
            return None, None
        try:
            mwc = await self.store.get_webhook_configuration(name)
        except StoreError as e:
            log.warning("cannot read MutatingWebhookConfiguration %s: %s", name, e)
            return None, str(e)
        if (mwc is None) != self._mwc_missing:  # log changes, not every pass
            self._mwc_missing = mwc is None
            if mwc is None:
                log.warning(
                    "MutatingWebhookConfiguration %s not found: caBundle not published", name
                )
            else:
                log.info("MutatingWebhookConfiguration %s found", name)
        return mwc, None if mwc is not None else f"MutatingWebhookConfiguration {name} not found"

    def _is_published(
        self, mwc: Mapping[str, Any] | None, ca: x509.Certificate, now: dt.datetime
    ) -> bool:
        """Whether `ca` has been in every webhook entry's caBundle for `ca_publish_grace`, as far
        as this replica has seen. A replica that restarts starts counting again (conservative)."""
        if self.config.webhook_config_name is None:
            return True
        fp = pki.fingerprint(ca)
        entries = (mwc or {}).get("webhooks") or []
        everywhere = mwc is not None and all(
            fp in _bundle_fingerprints((w.get("clientConfig") or {}).get("caBundle"))
            for w in entries
        )
        if not everywhere:
            self._published_since.pop(fp, None)
            return False
        since = self._published_since.setdefault(fp, now)
        return now - since >= self.config.ca_publish_grace

    async def _publish(
        self, mwc: Mapping[str, Any] | None, bundle: bytes, now: dt.datetime
    ) -> bool:
        """Write `bundle` into every webhook entry's caBundle where it differs (one JSON patch,
        conditional on the configuration's resourceVersion). True if a patch was sent."""
        name = self.config.webhook_config_name
        if name is None or mwc is None:
            return False
        want = base64.b64encode(bundle).decode()
        ops: list[dict[str, Any]] = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": mwc["metadata"]["resourceVersion"],
            }
        ]
        for i, entry in enumerate(mwc.get("webhooks") or []):
            if (entry.get("clientConfig") or {}).get("caBundle") != want:
                ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": entry["name"]})
                ops.append(
                    {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want}
                )
        if len(ops) == 1:
            return False
        await self.store.patch_webhook_configuration(name, ops)
        for cert in pki.load_certs(bundle):
            self._published_since.setdefault(pki.fingerprint(cert), now)
        log.info("caBundle published to %d webhook entries of %s", (len(ops) - 1) // 2, name)
        return True

    # --- the loop ---
    def trigger(self) -> None:
        """Make `run()` reconcile now instead of at its next tick."""
        self._wake.set()

    def _next_delay(self) -> float:
        cfg = self.config
        delay = cfg.resync_interval * random.uniform(0.9, 1.1)
        r = self.last_result
        if r is not None:
            due = (
                r.serving.not_after
                - (r.serving.not_after - r.serving.not_before) * cfg.renew_fraction
            )
            delay = min(delay, max((due - self.clock()).total_seconds(), 0) + 0.01)
            if r.rotation_pending:
                delay = min(delay, cfg.ca_publish_grace.total_seconds() + 0.01)
        return delay

    async def run(self) -> None:
        """Reconcile until cancelled."""
        backoff = 1.0
        while True:
            try:
                await self.reconcile()
                self.last_error = None
                backoff = 1.0
                delay = self._next_delay()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("certificate reconcile failed (retry in %.0fs): %s", backoff, e)
                delay = min(backoff, self.config.resync_interval)
                backoff = min(backoff * 2, 60.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)


def _same_serving(a: _State, b: _State) -> bool:
    return (a.serving is None and b.serving is None) or (
        a.serving is not None and b.serving is not None and a.serving == b.serving
    )


def _same_ca(a: _State, b: _State) -> bool:
    fa = pki.fingerprint(a.signer.cert) if a.signer else None
    fb = pki.fingerprint(b.signer.cert) if b.signer else None
    return fa == fb
