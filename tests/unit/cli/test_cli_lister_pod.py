"""The lister pod's decisions, pure: which storage it mounts (as the webhook mounted it into the
training pod), what the pod may do, and which leftover pods a later run deletes."""

from __future__ import annotations

import copy
import json
import re
import sys
from datetime import timedelta

import pytest

from kubeckpt_api.jobkinds import PYTORCHJOB, TRAINJOB, JobIdentity
from kubeckpt_api.policy import policy_from_object
from kubeckpt_api.storage import storage_plan
from kubeckpt_cli import lister_pod as lister
from kubeckpt_cli.errors import CliError
from kubeckpt_cli.view import now_utc
from tests.support.cli_objects import POLICY, injected_pod


def policy(name: str, uri: str, created: str = "2026-01-01T00:00:00Z", **storage) -> dict:
    obj = copy.deepcopy(POLICY)
    obj["metadata"].update(name=name, namespace="team-a", creationTimestamp=created)
    obj["spec"]["storage"] = {"uri": uri, **storage}
    return obj


def test_it_mounts_the_jobs_directory_where_the_training_pod_had_it() -> None:
    chosen = lister.choose_storage([policy("p", "pvc://ckpt/runs")], PYTORCHJOB, "team-a", "llama")
    # The training pod, as the webhook mutated it: same claim, subPath and path
    trained = injected_pod("llama", "team-a", storage="pvc://ckpt/runs")
    container = trained["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert chosen.checkpoint_uri == env["CHECKPOINT_URI"] == "/mnt/kubeckpt/team-a/llama"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == chosen.checkpoint_uri)
    assert chosen.mount == dict(mount, readOnly=True)
    assert chosen.mount["subPath"] == "runs/team-a/llama"
    assert chosen.volume in trained["spec"]["volumes"]
    assert chosen.policy == "p"
    # A TrainJob's directory is its kind's
    t = lister.choose_storage(
        [policy("p", "pvc://ckpt/runs", mountPath="/ckpt")], TRAINJOB, "team-a", "bert"
    )
    assert t.mount["subPath"] == "runs/team-a/_trainjob/bert"
    assert t.checkpoint_uri == "/ckpt/team-a/_trainjob/bert"
    uri, *_ = storage_plan(policy_from_object(policy("p", "pvc://ckpt/runs", mountPath="/ckpt")),
                           "team-a", JobIdentity(TRAINJOB, "bert"))  # fmt: skip
    assert t.checkpoint_uri == uri


def test_which_policy_when_there_are_several() -> None:
    a = policy("a", "pvc://fast/x", mountPath="/fast")
    b = policy("b", "pvc://slow/y", mountPath="/slow")
    with pytest.raises(CliError) as e:
        lister.choose_storage([a, b], PYTORCHJOB, "team-a", "llama")
    assert "several CheckpointPolicies could hold them (a, b): pick one with --policy" in str(
        e.value
    )
    # The recorded latest checkpoint says which one held it
    got = lister.choose_storage(
        [a, b], PYTORCHJOB, "team-a", "llama", latest="/slow/team-a/llama/checkpoint-20"
    )
    assert got.policy == "b"
    # Or the user says
    assert (
        lister.choose_storage([a, b], PYTORCHJOB, "team-a", "llama", policy_name="a").policy == "a"
    )
    with pytest.raises(CliError, match='no usable CheckpointPolicy "c"'):
        lister.choose_storage([a, b], PYTORCHJOB, "team-a", "llama", policy_name="c")
    # Being deleted, or invalid: not a candidate (the webhook would not use it either)
    gone = dict(a, metadata=dict(a["metadata"], deletionTimestamp="2026-03-01T00:00:00Z"))
    invalid = policy("z", "pvc://c/p")
    invalid["spec"]["maxCheckpoints"] = 0
    assert lister.choose_storage([gone, invalid, b], PYTORCHJOB, "team-a", "j").policy == "b"
    with pytest.raises(CliError, match="no usable CheckpointPolicy in namespace"):
        lister.choose_storage([gone, invalid], PYTORCHJOB, "team-a", "j")


def test_storage_a_pod_cannot_mount_says_so() -> None:
    # file:// is a path of the training pod's own filesystem: no other pod reaches it
    uri = "file:///data/ckpt"
    with pytest.raises(CliError) as e:
        lister.choose_storage([policy("p", uri)], PYTORCHJOB, "team-a", "llama")
    assert (
        e.value.message
        == f'CheckpointPolicy "p" has {uri}: file:// storage is only inside the training pod'
    )


def test_the_pod_may_read_the_storage_and_nothing_more() -> None:
    storage = lister.choose_storage([policy("p", "pvc://ckpt/runs")], PYTORCHJOB, "team-a", "j")
    name = lister.pod_name("j")
    pod = lister.lister_pod(
        name, "j", storage, "img:1", deadline_seconds=30, max_entries=200, max_bytes=262144
    )
    spec = pod["spec"]
    assert pod["metadata"]["labels"][lister.LISTER_LABEL] == "true"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 30
    assert spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    assert c["command"] == [
        "python3", "-m", "trainer_runtime.listing", "--persistent", "/mnt/kubeckpt/team-a/j",
        "--max-entries", "200", "--max-bytes", "262144",
    ]  # fmt: skip
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert set(c["resources"]["limits"]) >= {"cpu", "memory"}
    assert c["volumeMounts"] == [
        {
            "name": storage.volume["name"],
            "mountPath": "/mnt/kubeckpt/team-a/j",
            "subPath": "runs/team-a/j",
            "readOnly": True,
        }
    ]
    (v,) = spec["volumes"]
    assert v["persistentVolumeClaim"] == {"claimName": "ckpt", "readOnly": True}
    assert "hostPath" not in str(pod) and "serviceAccountName" not in spec
    assert_least_privilege(pod)


AWS_KEYS = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
}


def assert_least_privilege(pod: dict) -> None:
    """What every lister pod holds, whatever its storage."""
    spec = pod["spec"]
    assert pod["metadata"]["labels"][lister.LISTER_LABEL] == "true"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 0
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == sc["runAsGroup"] == 65532
    assert c["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert "hostPath" not in str(pod) and "serviceAccountName" not in spec
    assert "initContainers" not in spec and "hostNetwork" not in spec


def test_an_s3_policy_gives_the_pod_what_the_webhook_gave_the_training_pod() -> None:
    obj = policy("p", "s3://bucket/runs", secretRef={"name": "s3-creds"})
    storage = lister.choose_storage([obj], PYTORCHJOB, "team-a", "llama")
    # The training pod, as the webhook mutated it: the same prefix, the same references
    trained = injected_pod("llama", "team-a", storage="s3://bucket/runs", secret="s3-creds")
    env = {e["name"]: e for e in trained["spec"]["containers"][0]["env"]}
    assert (
        storage.checkpoint_uri == env["CHECKPOINT_URI"]["value"] == "s3://bucket/runs/team-a/llama"
    )
    assert list(storage.env) == [env[k] for k in env if k in AWS_KEYS]
    assert storage.volume is None and storage.mount is None and storage.policy == "p"

    pod = lister.lister_pod(
        "n", "llama", storage, "img:1", deadline_seconds=30, max_entries=200, max_bytes=262144
    )
    assert_least_privilege(pod)
    spec = pod["spec"]
    assert spec["activeDeadlineSeconds"] == 30
    (c,) = spec["containers"]
    assert c["command"] == [
        "python3", "-m", "trainer_runtime.listing", "--persistent", "s3://bucket/runs/team-a/llama",
        "--max-entries", "200", "--max-bytes", "262144",
    ]  # fmt: skip
    # No volume at all: the bucket is reached over the network, with the Secret's keys
    assert "volumes" not in spec and "volumeMounts" not in c
    assert c["env"][0] == {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}
    refs = c["env"][1:]
    assert {e["name"] for e in refs} == AWS_KEYS and len(refs) == len(AWS_KEYS)
    for e in refs:
        # By reference only: the CLI never reads the Secret, its values are never in the spec
        assert set(e) == {"name", "valueFrom"}, e
        assert e["valueFrom"] == {
            "secretKeyRef": {"name": "s3-creds", "key": e["name"], "optional": True}
        }
    # A TrainJob's prefix is its kind's
    t = lister.choose_storage([obj], TRAINJOB, "team-a", "bert")
    assert t.checkpoint_uri == "s3://bucket/runs/team-a/_trainjob/bert"


def test_an_s3_policy_without_a_secret_gives_no_env() -> None:
    # The pod's ambient credentials then (a node role); the lister has no service account token
    storage = lister.choose_storage([policy("p", "s3://b/r")], PYTORCHJOB, "team-a", "j")
    pod = lister.lister_pod(
        "n", "j", storage, "i", deadline_seconds=5, max_entries=1, max_bytes=1024
    )
    assert_least_privilege(pod)
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}
    ]


def test_which_policy_with_s3_among_them() -> None:
    s3 = policy("s3", "s3://bucket/runs", secretRef={"name": "c"})
    pvc = policy("pvc", "pvc://ckpt/runs", mountPath="/ckpt")
    local = policy("local", "file:///data")
    # The only policy a pod can reach: chosen (a file:// one is no candidate's rival either)
    assert lister.choose_storage([s3], PYTORCHJOB, "team-a", "j").policy == "s3"
    with pytest.raises(
        CliError, match=r"several CheckpointPolicies could hold them \(local, pvc, s3\)"
    ):
        lister.choose_storage([s3, pvc, local], PYTORCHJOB, "team-a", "j")
    # The recorded latest checkpoint: an s3:// location below the job's prefix, or a path
    latest = "s3://bucket/runs/team-a/j/checkpoint-40"
    got = lister.choose_storage([s3, pvc, local], PYTORCHJOB, "team-a", "j", latest=latest)
    assert got.policy == "s3" and got.env
    in_generation = "s3://bucket/runs/team-a/j/generation-2/checkpoint-40"
    assert (
        lister.choose_storage([pvc, s3], PYTORCHJOB, "team-a", "j", latest=in_generation).policy
        == "s3"
    )
    on_pvc = "/ckpt/team-a/j/checkpoint-40"
    assert (
        lister.choose_storage([s3, pvc], PYTORCHJOB, "team-a", "j", latest=on_pvc).policy == "pvc"
    )
    # Another job's prefix (a name that starts like it) holds nothing of this one
    with pytest.raises(CliError, match="several CheckpointPolicies"):
        lister.choose_storage(
            [s3, pvc], PYTORCHJOB, "team-a", "j", latest="s3://bucket/runs/team-a/j2/checkpoint-1"
        )
    # Or the user says
    assert (
        lister.choose_storage([s3, pvc], PYTORCHJOB, "team-a", "j", policy_name="s3").policy == "s3"
    )
    with pytest.raises(CliError, match="file:// storage is only inside the training pod"):
        lister.choose_storage([s3, local], PYTORCHJOB, "team-a", "j", policy_name="local")


def test_a_listing_without_s3fs_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing in an image without fsspec: its tier says which packages, so that the CLI
    names the image to change (not the bucket, not the credentials)."""
    from trainer_runtime import listing

    monkeypatch.setitem(sys.modules, "fsspec", None)  # `import fsspec` raises ImportError
    doc = json.loads(listing.render(listing.listing("s3://bucket/runs/team-a/j", None)))
    (tier,) = doc["tiers"]
    assert tier["missing"] == "fsspec/s3fs"
    assert "fsspec/s3fs are not installed" in tier["error"]
    assert doc["checkpoints"] == []
    assert lister.missing_packages(doc) == "fsspec/s3fs"
    # Any other failure is the storage's, shown as a note as before
    assert (
        lister.missing_packages({"tiers": [{"tier": "persistent", "error": "cannot list: 403"}]})
        is None
    )
    for junk in ("junk", 5, {"missing": "x"}, [None, 3]):
        assert lister.missing_packages({"tiers": junk}) is None


def test_verify_asks_the_lister_pod_to_hash_too() -> None:
    storage = lister.choose_storage([policy("p", "pvc://ckpt/runs")], PYTORCHJOB, "team-a", "j")
    pod = lister.lister_pod(
        "n", "j", storage, "img:1", deadline_seconds=30, max_entries=200, max_bytes=262144,
        verify=True,
    )  # fmt: skip
    (c,) = pod["spec"]["containers"]
    assert c["command"][-1] == "--verify" and c["volumeMounts"][0]["readOnly"] is True


def test_pod_names_are_dns_labels_and_differ() -> None:
    long = "j" * 63
    names = {lister.pod_name(long) for _ in range(20)}
    assert len(names) == 20
    for n in names | {lister.pod_name("a-b")}:
        assert len(n) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n), n
    assert lister.deadline_for(0.2) == 1 and lister.deadline_for(30.5) == 31


def test_leftover_pods_are_those_ended_or_old() -> None:
    now = now_utc()

    def pod(phase: str, age_s: float) -> dict:
        created = (now - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"metadata": {"creationTimestamp": created}, "status": {"phase": phase}}

    assert lister.stale(pod("Succeeded", 5), now)
    assert lister.stale(pod("Failed", 5), now)
    assert lister.stale(pod("Pending", lister.STALE_SECONDS + 60), now)
    assert not lister.stale(pod("Running", 5), now)  # another user's listing, in flight
    assert not lister.stale({"metadata": {}, "status": {"phase": "Pending"}}, now)


def test_it_goes_where_the_jobs_pod_went() -> None:
    storage = lister.choose_storage([policy("p", "pvc://ckpt/runs")], PYTORCHJOB, "team-a", "j")
    trained = {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "serviceAccountName": "trainer",
        "containers": [{"name": "pytorch"}],
    }
    pod = lister.lister_pod(
        "n", "j", storage, "i", deadline_seconds=5, max_entries=1, max_bytes=1024,
        placement=trained,
    )  # fmt: skip
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "serviceAccountName" not in spec and "affinity" not in spec
    bare = lister.lister_pod(
        "n", "j", storage, "i", deadline_seconds=5, max_entries=1, max_bytes=1024
    )
    assert not {"nodeSelector", "tolerations", "affinity"} & set(bare["spec"])
