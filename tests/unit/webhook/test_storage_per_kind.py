"""Each job gets its kind's own checkpoint directory (JobKind.storage_dir): a PyTorchJob keeps
`<ns>/<name>` (its existing checkpoints still resume), every other kind `<ns>/_<kind>/<name>`, so
jobs of different kinds with one name never share, or nest in, each other's checkpoints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB, TRAINJOB
from kubeckpt_api.storage import AWS_SECRET_KEYS
from tests.support.operator_pods import operator_pod
from webhook.mutation import mutate

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
# DNS labels: what a job name and a namespace name are
dns_labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


def policy(uri: str) -> dict:
    return {"metadata": {"name": "p", "namespace": "team-a"}, "spec": {"storage": {"uri": uri}}}


def env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def nested_or_equal(a: str, b: str) -> bool:
    pa, pb = a.rstrip("/").split("/"), b.rstrip("/").split("/")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def test_the_kinds_directories() -> None:
    assert PYTORCHJOB.storage_dir("team-a", "llama") == "team-a/llama"
    assert TRAINJOB.storage_dir("team-a", "llama") == "team-a/_trainjob/llama"


@given(ns1=dns_labels, ns2=dns_labels, n1=dns_labels, n2=dns_labels, data=st.data())
def test_no_two_jobs_share_or_nest_directories(
    ns1: str, ns2: str, n1: str, n2: str, data: st.DataObject
) -> None:
    k1 = data.draw(st.sampled_from(JOB_KINDS))
    k2 = data.draw(st.sampled_from(JOB_KINDS))
    if (ns1, k1, n1) == (ns2, k2, n2):
        assert k1.storage_dir(ns1, n1) == k2.storage_dir(ns2, n2)
    else:
        assert not nested_or_equal(k1.storage_dir(ns1, n1), k2.storage_dir(ns2, n2))


@pytest.mark.parametrize(
    ("uri", "pytorchjob", "trainjob"),
    [
        ("pvc://ckpt/runs", "/mnt/kubeckpt/team-a/llama", "/mnt/kubeckpt/team-a/_trainjob/llama"),
        ("s3://bucket/p", "s3://bucket/p/team-a/llama", "s3://bucket/p/team-a/_trainjob/llama"),
        ("file:///shared", "/shared/team-a/llama", "/shared/team-a/_trainjob/llama"),
    ],
)
def test_same_name_pytorchjob_and_trainjob_pods_get_separate_storage(
    uri: str, pytorchjob: str, trainjob: str
) -> None:
    pt = mutate(operator_pod("PyTorchJob", "llama", "team-a"), policy(uri), NS)
    tj = mutate(operator_pod("TrainJob", "llama", "team-a"), policy(uri), NS)
    assert pt.injected and tj.injected
    assert env(pt.pod)["CHECKPOINT_URI"] == pytorchjob  # unchanged: old checkpoints resume
    assert env(tj.pod)["CHECKPOINT_URI"] == trainjob
    assert not nested_or_equal(pytorchjob, trainjob)
    if uri.startswith("pvc://"):
        mounts = [
            next(m for m in r.pod["spec"]["containers"][0]["volumeMounts"] if "subPath" in m)
            for r in (pt, tj)
        ]
        subpaths = [m["subPath"] for m in mounts]
        assert subpaths == ["runs/team-a/llama", "runs/team-a/_trainjob/llama"]
        assert [m["mountPath"] for m in mounts] == [pytorchjob, trainjob]
        assert not nested_or_equal(*subpaths)


@pytest.mark.parametrize(("kind", "target"), [("PyTorchJob", "pytorch"), ("TrainJob", "node")])
def test_s3_credentials_reach_each_kinds_training_container_as_references(
    kind: str, target: str
) -> None:
    """A TrainJob's pods get the S3 endpoint and credentials as a PyTorchJob's do: references to
    the policy's Secret, in the kind's training container (`node`, after a sidecar here), none
    in the other containers, no volume; a key the user set in the trainer's env stays theirs."""
    pod = operator_pod(kind, "llama", "team-a")
    train = pod["spec"]["containers"][0]
    train["env"] = [{"name": "AWS_REGION", "value": "eu-west-1"}]
    pod["spec"]["containers"].insert(0, {"name": "sidecar", "image": "proxy:1"})
    pol = policy("s3://bucket/p")
    pol["spec"]["storage"]["secretRef"] = {"name": "s3-creds"}
    r = mutate(pod, pol, NS)
    assert r.injected
    sidecar, node = r.pod["spec"]["containers"]
    assert node["name"] == target and "env" not in sidecar
    env_ = {e["name"]: e for e in node["env"]}
    dir_ = "team-a/llama" if kind == "PyTorchJob" else "team-a/_trainjob/llama"
    assert env_["CHECKPOINT_URI"]["value"] == f"s3://bucket/p/{dir_}"
    assert env_["AWS_REGION"] == {"name": "AWS_REGION", "value": "eu-west-1"}
    for key in set(AWS_SECRET_KEYS) - {"AWS_REGION"}:
        assert env_[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key, "optional": True}},
        }
    assert "env/AWS_REGION" in r.skipped
    assert not any("persistentVolumeClaim" in v for v in r.pod["spec"].get("volumes") or [])
