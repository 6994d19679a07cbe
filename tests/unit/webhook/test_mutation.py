"""The pod mutation as a pure function: what is added, what is never overwritten, idempotency."""

from __future__ import annotations

import copy
import json

import jsonpatch
import pytest

from kubeckpt_api.optin import select_policy
from kubeckpt_api.policy import Policy, apply_overrides
from tests.support.operator_pods import batch_job_owner, pytorchjob_owner
from webhook.mutation import (
    INJECTED_LABEL,
    STATUS_ANNOTATION,
    grace_seconds,
    local_size_limit,
    mutate,
    prestop_command,
)

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
PLAIN_NS = {"metadata": {"name": "team-a"}}


def policy(**spec: object) -> dict:
    base: dict = {"storage": {"uri": "pvc://ckpt/runs"}}
    base.update(spec)
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {
            "name": "p1",
            "namespace": "team-a",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": base,
    }


def pod(**over: object) -> dict:
    p: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "job-x-master-",
            "namespace": "team-a",
            "labels": {
                "training.kubeflow.org/job-name": "job-x",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": "master",
            },
            # as the training-operator creates it: the job is the pod's controller
            "ownerReferences": [pytorchjob_owner("job-x")],
        },
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {
                    "name": "pytorch",
                    "image": "trainer:1",
                    "command": ["bash", "-c", "torchrun train.py"],
                    "env": [{"name": "PET_NNODES", "value": "4"}],
                },
            ],
        },
    }
    p.update(over)
    return p


def env_of(p: dict, container: str = "pytorch") -> dict[str, dict]:
    c = next(c for c in p["spec"]["containers"] if c["name"] == container)
    return {e["name"]: e for e in c.get("env", [])}


def test_injects_everything_design_lists_into_the_target_container() -> None:
    r = mutate(pod(), policy(), NS)
    assert r.injected and r.reason == "injected"
    env = env_of(r.pod)
    assert env["TRAINING_PROGRESS_FILE"]["value"] == "/var/run/kubeckpt/progress.json"
    assert env["CHECKPOINT_ENABLED"]["value"] == "true"
    assert env["CHECKPOINT_URI"]["value"] == "/mnt/kubeckpt/team-a/job-x"
    assert env["CHECKPOINT_INTERVAL"]["value"] == "300"
    assert env["CHECKPOINT_STRATEGY"]["value"] == "time"
    assert env["CHECKPOINT_MAX_CHECKPOINTS"]["value"] == "3"
    assert env["CHECKPOINT_RESUME"]["value"] == "true"
    assert env["CHECKPOINT_JIT"]["value"] == "true"
    assert env["CHECKPOINT_CONTROL_DIR"]["value"] == "/var/run/kubeckpt"
    assert env["PROGRESS_UPDATE_FREQUENCY"]["value"] == "5"
    assert env["KUBECKPT_JOB_KIND"]["value"] == "PyTorchJob"
    assert env["KUBECKPT_JOB_NAME"]["value"] == "job-x"
    assert env["KUBECKPT_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # No measured save time: the policy's bound; torchrun keeps a margin inside it.
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 300
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"]) < 300
    assert "CHECKPOINT_LOCAL_DIR" not in env
    # The sidecar is left alone.
    assert "env" not in r.pod["spec"]["containers"][0]
    c = r.pod["spec"]["containers"][1]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kubeckpt-run"]["mountPath"] == "/var/run/kubeckpt"
    assert mounts["kubeckpt-storage"] == {
        "name": "kubeckpt-storage",
        "mountPath": "/mnt/kubeckpt/team-a/job-x",
        "subPath": "runs/team-a/job-x",
    }
    vols = {v["name"]: v for v in r.pod["spec"]["volumes"]}
    assert vols["kubeckpt-storage"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert vols["kubeckpt-run"] == {"name": "kubeckpt-run", "emptyDir": {}}
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "/bin/sh"
    assert r.pod["metadata"]["labels"][INJECTED_LABEL] == "true"
    status = json.loads(r.pod["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["policy"] == "p1" and status["container"] == "pytorch"
    assert "version" in status


def test_patch_reproduces_the_patched_pod_and_escapes_pointer_tokens() -> None:
    original = pod()
    r = mutate(original, policy(), NS)
    assert jsonpatch.apply_patch(original, r.patch) == r.pod
    paths = [op["path"] for op in r.patch]
    # metadata.annotations was absent: added whole; labels present: added key by key, escaped.
    assert "/metadata/annotations" in paths
    assert "/metadata/labels/kubeckpt.io~1injected" in paths
    # env present -> appended; volumes absent -> added whole.
    assert "/spec/containers/1/env/-" in paths
    assert "/spec/volumes" in paths
    assert original == pod(), "the input is not modified"


def test_a_handed_over_pod_is_patched_in_place_with_the_same_result() -> None:
    """copy_pod=False (the server's path) skips the copy and changes nothing else."""
    copied = mutate(pod(), policy(), NS)
    mine = pod()
    handed = mutate(mine, policy(), NS, copy_pod=False)
    assert handed.pod is mine
    assert handed.patch == copied.patch and handed.pod == copied.pod
    assert jsonpatch.apply_patch(pod(), handed.patch) == handed.pod
    again = mutate(handed.pod, policy(), NS, copy_pod=False)
    assert again.patch == [] and again.reason == "already injected"


def test_idempotent_on_reinvocation() -> None:
    r1 = mutate(pod(), policy(), NS)
    r2 = mutate(r1.pod, policy(), NS)
    assert r2.patch == [] and r2.pod == r1.pod and r2.reason == "already injected"


def test_never_overwrites_user_values_and_records_what_was_skipped() -> None:
    p = pod()
    c = p["spec"]["containers"][1]
    c["env"].append({"name": "CHECKPOINT_URI", "value": "s3://mine/x"})
    c["volumeMounts"] = [{"name": "data", "mountPath": "/var/run/kubeckpt"}]
    c["lifecycle"] = {"preStop": {"exec": {"command": ["my-hook"]}}}
    p["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}},
        {"name": "kubeckpt-storage", "emptyDir": {}},
    ]
    p["spec"]["terminationGracePeriodSeconds"] = 900
    r = mutate(p, policy(), NS)
    env = env_of(r.pod)
    assert env["CHECKPOINT_URI"]["value"] == "s3://mine/x"
    c2 = r.pod["spec"]["containers"][1]
    assert c2["lifecycle"] == {"preStop": {"exec": {"command": ["my-hook"]}}}
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 900
    assert {"name": "kubeckpt-storage", "emptyDir": {}} in r.pod["spec"]["volumes"]
    assert sum(v["name"] == "kubeckpt-storage" for v in r.pod["spec"]["volumes"]) == 1
    assert [m for m in c2["volumeMounts"] if m["mountPath"] == "/var/run/kubeckpt"] == [
        {"name": "data", "mountPath": "/var/run/kubeckpt"}
    ]
    status = json.loads(r.pod["metadata"]["annotations"][STATUS_ANNOTATION])
    assert set(status["skipped"]) == {
        "env/CHECKPOINT_URI",
        "volume/kubeckpt-storage",
        "volumeMount//var/run/kubeckpt",
        "lifecycle/preStop",
        "terminationGracePeriodSeconds",
    }
    # The user's larger grace period sizes the hook and torchrun's timeout.
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"]) > 300


@pytest.mark.parametrize(
    ("labels", "ns", "expect"),
    [
        ({}, NS, True),
        ({}, PLAIN_NS, False),
        ({"kubeckpt.io/inject": "true"}, PLAIN_NS, True),
        ({"kubeckpt.io/inject": "false"}, NS, False),
        ({"kubeckpt.io/inject": "false"}, PLAIN_NS, False),
    ],
)
def test_opt_in_and_opt_out(labels: dict, ns: dict, expect: bool) -> None:
    p = pod()
    p["metadata"]["labels"].update(labels)
    assert mutate(p, policy(), ns).injected is expect


def test_non_training_and_policyless_pods_pass_unchanged() -> None:
    plain = {
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c"}]},
    }
    r = mutate(plain, policy(), NS)
    assert r.patch == [] and r.reason == "not a training pod"
    r = mutate(pod(), None, NS)
    assert r.patch == [] and r.reason == "no matching CheckpointPolicy"


def test_trainjob_pods_target_the_node_container() -> None:
    p = {
        "metadata": {
            "labels": {"jobset.sigs.k8s.io/jobset-name": "tj"},
            "namespace": "team-a",
            "ownerReferences": [batch_job_owner("tj")],
        },
        "spec": {"containers": [{"name": "init-ish"}, {"name": "node"}]},
    }
    r = mutate(p, policy(), NS)
    assert env_of(r.pod, "node")["KUBECKPT_JOB_KIND"]["value"] == "TrainJob"
    assert "env" not in r.pod["spec"]["containers"][0]


def test_first_container_when_none_is_named_as_expected() -> None:
    p = pod()
    p["spec"]["containers"] = [{"name": "main"}, {"name": "other"}]
    r = mutate(p, policy(), NS)
    assert "CHECKPOINT_URI" in env_of(r.pod, "main")


def test_annotation_overrides_validated_invalid_ignored_with_warning() -> None:
    p = pod()
    p["metadata"]["annotations"] = {
        "kubeckpt.io/interval": "10m",
        "kubeckpt.io/max-checkpoints": "5",
        "kubeckpt.io/resume": "maybe",
        "kubeckpt.io/strategy": "hourly",
        "kubeckpt.io/bogus": "1",
    }
    # max-checkpoints is a limit: 5 applies under a policy that allows 10 (tests of the ceiling:
    # test_policy_ceiling.py)
    r = mutate(p, policy(maxCheckpoints=10), NS)
    env = env_of(r.pod)
    assert env["CHECKPOINT_INTERVAL"]["value"] == "600"
    assert env["CHECKPOINT_MAX_CHECKPOINTS"]["value"] == "5"
    assert env["CHECKPOINT_RESUME"]["value"] == "true"
    assert env["CHECKPOINT_STRATEGY"]["value"] == "time"
    text = " ".join(r.warnings)
    assert "kubeckpt.io/resume" in text and "kubeckpt.io/strategy" in text
    assert "kubeckpt.io/bogus" in text


def test_adaptive_grace_from_measured_save_time_is_clamped() -> None:
    pol = Policy(name="p", namespace="n", storage_uri="file:///x", max_grace_seconds=300)

    def tp(step: str, save: str) -> dict:
        return {"status": {"stepSeconds": step, "checkpointing": {"lastSaveSeconds": save}}}

    assert grace_seconds(pol, None) == 300
    assert grace_seconds(pol, tp("2", "20")) == 43  # (2 + 20) * 1.5 + 10
    assert grace_seconds(pol, tp("0.1", "1")) == 30  # never below 30 s
    assert grace_seconds(pol, tp("60", "400")) == 300  # never above the policy's bound
    assert grace_seconds(pol, tp("x", "nan")) == 300  # nonsense: the bound
    r = mutate(pod(), policy(), NS, tp("2", "20"))
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 43


def test_grace_never_lowered() -> None:
    p = pod()
    p["spec"]["terminationGracePeriodSeconds"] = 120
    r = mutate(p, policy(jit={"enabled": True, "maxGracePeriodSeconds": 60}), NS)
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 120


def test_jit_disabled_adds_no_hook_and_keeps_grace() -> None:
    r = mutate(pod(), policy(jit={"enabled": False}), NS)
    c = r.pod["spec"]["containers"][1]
    assert "lifecycle" not in c
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 30
    assert env_of(r.pod)["CHECKPOINT_JIT"]["value"] == "false"
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in env_of(r.pod)


def test_local_tier_size_from_model_parameters_per_node() -> None:
    r = mutate(pod(), policy(localTier={"enabled": True, "modelParameters": 7_000_000_000}), NS)
    vols = {v["name"]: v for v in r.pod["spec"]["volumes"]}
    # 2 x (7e9 x 12 B / 4 nodes) x 1.15 = 48.3e9 B = 46063 MiB (rounded up)
    assert vols["kubeckpt-local"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "46063Mi"}
    env = env_of(r.pod)
    assert env["CHECKPOINT_LOCAL_DIR"]["value"] == "/var/run/kubeckpt/local"
    assert env["CHECKPOINT_LOCAL_PERIOD"]["value"] == "100"
    pol = Policy(
        name="p",
        namespace="n",
        storage_uri="file:///x",
        local_size_limit="64Gi",
        local_model_parameters=10,
    )
    assert local_size_limit(pol, 4) == "64Gi"


def test_s3_storage_passes_secret_references_never_values() -> None:
    r = mutate(
        pod(), policy(storage={"uri": "s3://bucket/prefix", "secretRef": {"name": "s3"}}), NS
    )
    env = env_of(r.pod)
    assert env["CHECKPOINT_URI"]["value"] == "s3://bucket/prefix/team-a/job-x"
    ref = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "s3", "key": "AWS_SECRET_ACCESS_KEY", "optional": True}
    assert "kubeckpt-storage" not in {v["name"] for v in r.pod["spec"]["volumes"]}


def test_file_storage() -> None:
    r = mutate(pod(), policy(storage={"uri": "file:///shared/ckpt"}), NS)
    assert env_of(r.pod)["CHECKPOINT_URI"]["value"] == "/shared/ckpt/team-a/job-x"


def test_oldest_matching_policy_wins() -> None:
    old = policy()
    old["metadata"].update(name="old", creationTimestamp="2025-01-01T00:00:00Z")
    new = policy()
    new["metadata"].update(name="new", creationTimestamp="2026-01-01T00:00:00Z")
    other = policy(selector={"matchLabels": {"team": "b"}})
    other["metadata"].update(name="other", creationTimestamp="2020-01-01T00:00:00Z")
    chosen, warnings = select_policy([new, other, old], {"team": "a"})
    assert chosen is not None and chosen["metadata"]["name"] == "old"
    assert warnings and "oldest wins" in warnings[0]


def test_overrides_steps_without_save_steps_fall_back() -> None:
    pol = Policy(name="p", namespace="n", storage_uri="file:///x")
    got, warnings = apply_overrides(pol, {"kubeckpt.io/strategy": "steps"})
    assert got.strategy == "time" and warnings
    got, warnings = apply_overrides(
        pol, {"kubeckpt.io/strategy": "steps", "kubeckpt.io/save-steps": "50"}
    )
    assert (got.strategy, got.save_steps, warnings) == ("steps", 50, [])


def test_prestop_waits_a_bounded_time() -> None:
    cmd = prestop_command(42)
    assert cmd[:2] == ["/bin/sh", "-c"]
    assert "kubeckpt-prestop --timeout 42" in cmd[2]
    assert "-lt 42" in cmd[2]


def test_input_never_mutated() -> None:
    p = pod()
    before = copy.deepcopy(p)
    mutate(p, policy(localTier={"enabled": True}), NS)
    assert p == before


def test_on_unverifiable_checkpoints_reaches_the_runtime_only_when_loosened() -> None:
    """The policy's onUnverifiableCheckpoints (issue 27): Fail is the runtime's own default, so
    only StartFresh is injected (CHECKPOINT_ON_UNVERIFIABLE), and the runtime parses it."""
    from trainer_runtime.contract import RuntimeSettings

    assert "CHECKPOINT_ON_UNVERIFIABLE" not in env_of(mutate(pod(), policy(), NS).pod)
    strict = policy(onUnverifiableCheckpoints="Fail")
    assert "CHECKPOINT_ON_UNVERIFIABLE" not in env_of(mutate(pod(), strict, NS).pod)
    loose = env_of(mutate(pod(), policy(onUnverifiableCheckpoints="StartFresh"), NS).pod)
    assert loose["CHECKPOINT_ON_UNVERIFIABLE"] == {
        "name": "CHECKPOINT_ON_UNVERIFIABLE",
        "value": "StartFresh",
    }
    settings = RuntimeSettings.from_env({k: e["value"] for k, e in loose.items() if "value" in e})
    assert settings.on_unverifiable == "StartFresh"
