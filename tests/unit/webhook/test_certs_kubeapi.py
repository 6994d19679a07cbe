"""The small API client's credentials and JSON-patch test evaluation (no cluster)."""

from __future__ import annotations

import base64
import datetime as dt
import os
from pathlib import Path

import pytest
import yaml

from webhook import certs_pki as pki
from webhook.kubeapi import KubeAPI, _test_holds


def ca_pem() -> bytes:
    now = dt.datetime.now(dt.UTC)
    return pki.make_ca(
        "api", now=now, validity=dt.timedelta(days=1), backdate=dt.timedelta(0)
    ).cert_pem


def test_kubeconfig_with_a_token(tmp_path: Path) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://10.0.0.1:6443",
                    "certificate-authority-data": base64.b64encode(ca_pem()).decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    api = KubeAPI.from_kubeconfig(path)
    assert api.server == "https://10.0.0.1:6443"
    assert api.authorization() == "Bearer s3cret"
    assert api.ssl_context.verify_mode.name == "CERT_REQUIRED"


def test_in_cluster_rereads_a_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.crt").write_bytes(ca_pem())
    token = tmp_path / "token"
    token.write_text("one\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = KubeAPI.in_cluster(tmp_path)
    assert api.server == "https://10.96.0.1:443"
    assert api.authorization() == "Bearer one"
    # The kubelet swaps the projected token file: a new inode.
    (tmp_path / "token.new").write_text("two")
    os.replace(tmp_path / "token.new", token)
    assert api.authorization() == "Bearer two"


def test_json_patch_test_evaluation_follows_rfc6901_escapes() -> None:
    obj = {"metadata": {"resourceVersion": "7", "annotations": {"a/b~c": "x"}}, "l": [1, {"k": 2}]}
    assert _test_holds(obj, {"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
    assert not _test_holds(obj, {"op": "test", "path": "/metadata/resourceVersion", "value": "8"})
    assert _test_holds(obj, {"op": "test", "path": "/metadata/annotations/a~1b~0c", "value": "x"})
    assert _test_holds(obj, {"op": "test", "path": "/l/1/k", "value": 2})
    assert not _test_holds(obj, {"op": "test", "path": "/l/5", "value": 2})
    assert not _test_holds(obj, {"op": "test", "path": "/missing", "value": None})
    assert _test_holds(obj, {"op": "add", "path": "/x", "value": 1})
