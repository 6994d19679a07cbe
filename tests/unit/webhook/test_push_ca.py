"""The progress push CA file of the webhook (--progress-push-ca-file): only certificates, bounded,
reloaded when the file changes; anything unusable is an error in the log and pods fall back to the
ConfigMap (pem None), never a failed pod."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest

from reconciler.pki import CertificateError, make_ca
from webhook.push_ca import MAX_CA_BYTES, PushCAFile, push_ca_pem

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)


def ca() -> tuple[bytes, bytes]:
    pair = make_ca("kubeckpt-progress-ca", now=NOW, validity=dt.timedelta(days=3650),
                   backdate=dt.timedelta(hours=1))  # fmt: skip
    return pair.cert_pem, pair.key_pem


def test_one_or_more_certificates_pass_as_plain_pem() -> None:
    (a, _), (b, _) = ca(), ca()
    assert push_ca_pem(a) == a.decode()
    assert push_ca_pem(a + b) == (a + b).decode()


def test_nothing_but_certificates_reaches_a_pod() -> None:
    cert, key = ca()
    hostile = b"#!/bin/sh\n" + cert + b'"; rm -rf / #\n' + key
    out = push_ca_pem(hostile)
    assert out == cert.decode()
    assert "PRIVATE KEY" not in out and "rm -rf" not in out


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not a certificate\n",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ca()[1],  # a private key alone
    ],
)
def test_no_usable_certificate_is_refused(data: bytes) -> None:
    with pytest.raises(CertificateError):
        push_ca_pem(data)


def test_an_oversize_bundle_is_refused() -> None:
    cert, _ = ca()
    many = cert * (MAX_CA_BYTES // len(cert) + 1)
    assert len(many) > MAX_CA_BYTES
    with pytest.raises(CertificateError, match="over"):
        push_ca_pem(many)


def test_the_file_is_loaded_and_reloaded_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    first, second = ca()[0], ca()[0]
    path.write_bytes(first)
    f = PushCAFile(path)
    assert f.load_once() and f.current() == first.decode()
    assert not f.load_once()  # same bytes: no reload
    path.write_bytes(second)
    assert f.load_once() and f.current() == second.decode()


def test_a_bad_or_missing_file_logs_an_error_and_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ca.crt"
    good = ca()[0]
    f = PushCAFile(path)
    with caplog.at_level(logging.ERROR, logger="webhook.push_ca"):
        assert not f.load_once() and f.current() is None  # missing
        path.write_bytes(good)
        assert f.load_once() and f.current() == good.decode()
        path.write_bytes(good * (MAX_CA_BYTES // len(good) + 1))  # oversize: dropped, not kept
        assert not f.load_once() and f.current() is None
        path.unlink()
        assert not f.load_once() and f.current() is None
        path.write_bytes(good)  # the same good contents as before come back
        assert f.load_once() and f.current() == good.decode()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3, errors
    assert all("kubeckpt-progress-ca" in e for e in errors)
    assert "over" in errors[1]
