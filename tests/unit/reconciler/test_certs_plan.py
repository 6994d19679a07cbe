"""What the Secret should hold at a given time: creation, renewal, CA rotation (`now` injected)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError

from reconciler import pki
from reconciler.admission import (
    CA_BUNDLE,
    CA_KEY,
    CA_NEXT_KEY,
    TLS_CERT,
    TLS_KEY,
    CertConfig,
    plan_secret,
)

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
CFG = CertConfig(
    service="svc",
    namespace="ns",
    serving_validity=90 * DAY,
    ca_validity=365 * DAY,
    backdate=dt.timedelta(0),
)
HOST = "svc.ns.svc"


def serving(data: dict[str, bytes]) -> x509.Certificate:
    return pki.check_pair(data[TLS_CERT], data[TLS_KEY])


def bundle(data: dict[str, bytes]) -> list[x509.Certificate]:
    return pki.load_certs(data[CA_BUNDLE])


def signer(data: dict[str, bytes]) -> x509.Certificate:
    key = pki.load_private_key(data[CA_KEY])
    (ca,) = [c for c in bundle(data) if pki.key_matches(c, key)]
    return ca


def trusted(leaf: x509.Certificate, cas: list[x509.Certificate], at: dt.datetime) -> bool:
    verifier = PolicyBuilder().store(Store(cas)).time(at).build_server_verifier(DNSName(HOST))
    try:
        verifier.verify(leaf, [])
    except VerificationError:
        return False
    return True


def fresh(now: dt.datetime = T0) -> dict[str, bytes]:
    plan = plan_secret(None, CFG, now)
    assert plan.data is not None
    return plan.data


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate() -> None:
    plan = plan_secret(None, CFG, T0)
    assert plan.actions == ("CA created", "serving certificate issued: none usable in the Secret")
    data = plan.data
    assert data is not None and set(data) == {TLS_CERT, TLS_KEY, CA_BUNDLE, CA_KEY}
    assert len(bundle(data)) == 1 and signer(data) == bundle(data)[0]
    assert trusted(serving(data), bundle(data), T0)
    assert pki.sans_of(serving(data)) == ({"svc.ns.svc", "svc.ns.svc.cluster.local"}, set())


@pytest.mark.parametrize("age_days", [0, 1, 30, 59.9])
def test_a_valid_secret_is_kept_as_it_is(age_days: float) -> None:
    assert plan_secret(fresh(), CFG, T0 + dt.timedelta(days=age_days)).data is None


@pytest.mark.parametrize("age_days", [60.1, 75, 89.9, 90, 200])
def test_the_serving_certificate_is_renewed_by_the_same_ca_once_a_third_is_left(
    age_days: float,
) -> None:
    data = fresh()
    now = T0 + dt.timedelta(days=age_days)
    plan = plan_secret(data, CFG, now)
    assert plan.data is not None
    assert plan.actions == ("serving certificate issued: renewal due",)
    assert plan.data[CA_BUNDLE] == data[CA_BUNDLE] and plan.data[CA_KEY] == data[CA_KEY]
    new = serving(plan.data)
    assert new.serial_number != serving(data).serial_number
    assert new.not_valid_before_utc == now
    assert trusted(new, bundle(data), now), "the published caBundle stays valid"
    assert plan_secret(plan.data, CFG, now).data is None


def test_renew_fraction_is_configurable() -> None:
    cfg = CertConfig(
        service="svc",
        namespace="ns",
        serving_validity=90 * DAY,
        ca_validity=365 * DAY,
        backdate=dt.timedelta(0),
        renew_fraction=0.5,
    )
    data = plan_secret(None, cfg, T0).data
    assert plan_secret(data, cfg, T0 + 44 * DAY).data is None
    assert plan_secret(data, cfg, T0 + 46 * DAY).data is not None


def test_garbage_is_replaced_and_unknown_keys_are_kept() -> None:
    data = {TLS_CERT: b"junk", TLS_KEY: b"", CA_BUNDLE: b"x", "extra": b"keep me"}
    plan = plan_secret(data, CFG, T0)
    assert plan.data is not None and plan.data["extra"] == b"keep me"
    assert "CA created" in plan.actions
    assert trusted(serving(plan.data), bundle(plan.data), T0)


def test_a_key_that_does_not_match_gets_a_new_serving_certificate_from_the_same_ca() -> None:
    data = fresh()
    other = fresh()
    broken = {**data, TLS_KEY: other[TLS_KEY]}
    plan = plan_secret(broken, CFG, T0)
    assert plan.actions == ("serving certificate issued: none usable in the Secret",)
    assert plan.data is not None and plan.data[CA_KEY] == data[CA_KEY]


def test_a_serving_certificate_from_another_ca_is_replaced() -> None:
    data = fresh()
    other = fresh()
    mixed = {**data, TLS_CERT: other[TLS_CERT], TLS_KEY: other[TLS_KEY]}
    plan = plan_secret(mixed, CFG, T0)
    assert plan.actions == ("serving certificate issued: not signed by the current CA",)
    assert plan.data is not None and pki.issued_by(serving(plan.data), signer(data))


def test_missing_names_are_added_and_replicas_with_different_names_converge() -> None:
    cfg_a = CertConfig(
        service="svc",
        namespace="ns",
        extra_dns_names=("a.example",),
        extra_ip_addresses=("127.0.0.1",),
        backdate=dt.timedelta(0),
    )
    cfg_b = CertConfig(service="svc", namespace="ns", extra_dns_names=("b.example",))
    data = plan_secret(None, cfg_a, T0).data
    assert data is not None
    plan = plan_secret(data, cfg_b, T0)
    assert plan.actions == ("serving certificate issued: names missing",)
    assert plan.data is not None
    dns, ips = pki.sans_of(serving(plan.data))
    assert {"a.example", "b.example", "svc.ns.svc"} <= dns and ips == {"127.0.0.1"}
    # Neither replica wants to change it now: no re-issuing in turns.
    assert plan_secret(plan.data, cfg_a, T0).data is None
    assert plan_secret(plan.data, cfg_b, T0).data is None


def test_forced_serving_renewal_keeps_the_ca() -> None:
    data = fresh()
    plan = plan_secret(data, CFG, T0, renew_serving=True)
    assert plan.actions == ("serving certificate issued: renewal requested",)
    assert plan.data is not None and plan.data[CA_BUNDLE] == data[CA_BUNDLE]


def test_ca_rotation_publishes_both_cas_first_and_only_then_switches_the_signer() -> None:
    data = fresh()
    old_ca = signer(data)
    now = T0 + 250 * DAY  # the CA has 115 of 365 days left: less than a third
    # Step 1: the new CA joins the bundle; serving certificates are still signed by the old one.
    step1 = plan_secret(data, CFG, now, ca_published=lambda _: False)
    assert step1.actions[0] == "CA rotation started: new CA added to the bundle"
    d1 = step1.data
    assert d1 is not None and CA_NEXT_KEY in d1
    old, new = bundle(d1)
    assert old == old_ca and new != old_ca and pki.is_ca(new)
    assert signer(d1) == old_ca
    assert pki.issued_by(serving(d1), old_ca)
    # Not yet published: nothing changes, however often we look.
    assert plan_secret(d1, CFG, now, ca_published=lambda _: False).data is None
    assert plan_secret(d1, CFG, now + DAY, ca_published=lambda _: False).data is None
    # Step 2: once the bundle is published, the new CA signs a new serving certificate.
    seen: list[x509.Certificate] = []

    def published(ca: x509.Certificate) -> bool:
        seen.append(ca)
        return True

    step2 = plan_secret(d1, CFG, now, ca_published=published)
    assert seen == [new]
    assert step2.actions == (
        "CA switched: the new CA is published in caBundle",
        "serving certificate issued: not signed by the current CA",
    )
    d2 = step2.data
    assert d2 is not None and CA_NEXT_KEY not in d2
    assert signer(d2) == new and bundle(d2) == [old, new], "the old CA stays for the overlap"
    assert pki.issued_by(serving(d2), new)
    # Replicas still serving the old certificate and those with the new one are both trusted.
    assert trusted(serving(d1), bundle(d2), now) and trusted(serving(d2), bundle(d2), now)
    assert plan_secret(d2, CFG, now).data is None
    # The old CA leaves the bundle when it expires.
    later = T0 + 366 * DAY
    d3 = plan_secret(d2, CFG, later).data
    assert d3 is not None and bundle(d3) == [new]


def test_forced_ca_rotation_and_no_second_rotation_while_one_is_pending() -> None:
    data = fresh()
    d1 = plan_secret(data, CFG, T0, rotate_ca=True, ca_published=lambda _: False).data
    assert d1 is not None and len(bundle(d1)) == 2
    assert plan_secret(d1, CFG, T0, rotate_ca=True, ca_published=lambda _: False).data is None


def test_the_signer_switches_without_publication_when_the_old_ca_is_about_to_expire() -> None:
    data = fresh()
    d1 = plan_secret(data, CFG, T0 + 250 * DAY, ca_published=lambda _: False).data
    assert d1 is not None
    # 29 days left on the old CA: less than a serving certificate's renewal window (30 days).
    plan = plan_secret(d1, CFG, T0 + 336 * DAY, ca_published=lambda _: False)
    assert plan.actions[0] == "CA switched before publication: the old CA is about to expire"
    # And if it has expired outright, the next CA takes over too.
    plan = plan_secret(d1, CFG, T0 + 400 * DAY, ca_published=lambda _: False)
    assert plan.actions[0] == "CA switched: the signing CA is missing or expired"
    assert plan.data is not None and len(bundle(plan.data)) == 1


def test_an_expired_ca_without_a_successor_is_replaced() -> None:
    data = fresh()
    plan = plan_secret(data, CFG, T0 + 400 * DAY)
    assert plan.actions[0] == "CA created"
    assert plan.data is not None and bundle(plan.data) != bundle(data)


def test_rotations_over_years_never_leave_a_served_certificate_untrusted() -> None:
    """Step through four years in 5-day ticks. The API server may hold the caBundle published at
    the previous tick, and a replica may still serve the previous tick's certificate: every
    combination must verify at every tick."""
    ca_published_at: dict[str, int] = {}
    published: list[x509.Certificate] = []  # what the webhook configuration holds
    data: dict[str, bytes] | None = None
    prev_serving: x509.Certificate | None = None
    switches = 0
    for tick in range(0, 4 * 365 // 5):
        now = T0 + tick * 5 * DAY

        def is_published(ca: x509.Certificate, tick: int = tick) -> bool:
            since = ca_published_at.get(pki.fingerprint(ca))
            return since is not None and since < tick

        plan = plan_secret(data, CFG, now, ca_published=is_published)
        switches += any(a.startswith("CA switched") for a in plan.actions)
        data = plan.data or data
        assert data is not None
        cur = serving(data)
        if published:
            assert trusted(cur, published, now), f"tick {tick}: new cert vs published bundle"
        if prev_serving is not None:
            assert trusted(prev_serving, bundle(data), now), f"tick {tick}: old cert vs new bundle"
        published = bundle(data)
        for ca in published:
            ca_published_at.setdefault(pki.fingerprint(ca), tick)
        prev_serving = cur
    assert switches >= 4


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="outlive"):
        CertConfig(service="s", namespace="n", serving_validity=DAY, ca_validity=DAY)
    with pytest.raises(ValueError, match="between 0 and 1"):
        CertConfig(service="s", namespace="n", renew_fraction=1.5)
    with pytest.raises(ValueError, match="CA rotation must start"):
        CertConfig(service="s", namespace="n", ca_validity=365 * DAY, ca_renew_fraction=0.05)
