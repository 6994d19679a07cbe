"""Hypothesis strategies for training pods (valid by construction) and CheckpointPolicies."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.operator_pods import batch_job_owner, pytorchjob_owner

OUR_ENV = ["CHECKPOINT_URI", "CHECKPOINT_INTERVAL", "TRAINING_PROGRESS_FILE", "CHECKPOINT_JIT"]
OUR_VOLUMES = ["kubeckpt-run", "kubeckpt-storage", "kubeckpt-local", "kubeckpt-progress-push"]
OUR_PATHS = ["/var/run/kubeckpt", "/mnt/kubeckpt/ns-x/job-x", "/var/run/kubeckpt/local"]

env_names = st.sampled_from([*OUR_ENV, "PET_NNODES", "HOME", "A_B", "x1", "MASTER_ADDR"])
vol_names = st.sampled_from([*OUR_VOLUMES, "data", "cache", "shm", "a-b~c"[:3]])
mount_paths = st.sampled_from([*OUR_PATHS, "/data", "/cache/", "/dev/shm", "/a/b~c/d"])
label_values = st.sampled_from(["x", "a.b", "a/b"[0], "1"])


@st.composite
def containers(draw: Any, name: str, volumes: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "trainer:1"}
    names = draw(st.lists(env_names, unique=True, max_size=5))
    if names or draw(st.booleans()):
        values = st.sampled_from(["1", "", "s3://u/p"])
        c["env"] = [{"name": n, "value": draw(values)} for n in names]
    if volumes and draw(st.booleans()):
        used = draw(st.lists(st.sampled_from(volumes), unique=True, max_size=len(volumes)))
        paths = draw(
            st.lists(
                mount_paths,
                unique_by=lambda p: p.rstrip("/"),
                min_size=len(used),
                max_size=len(used),
            )
        )
        c["volumeMounts"] = [{"name": v, "mountPath": p} for v, p in zip(used, paths, strict=True)]
    hook = draw(st.sampled_from([None, "empty", "preStop", "postStart"]))
    if hook == "empty":
        c["lifecycle"] = {}
    elif hook == "preStop":
        c["lifecycle"] = {"preStop": {"exec": {"command": ["user-hook"]}}}
    elif hook == "postStart":
        c["lifecycle"] = {"postStart": {"exec": {"command": ["user-start"]}}}
    return c


@st.composite
def training_pods(draw: Any, namespace: str = "ns-x") -> dict[str, Any]:
    kind = draw(st.sampled_from(["pytorch", "trainjob"]))
    labels: dict[str, str] = (
        {
            "training.kubeflow.org/job-name": "job-x",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
        }
        if kind == "pytorch"
        else {"jobset.sigs.k8s.io/jobset-name": "job-x"}
    )
    if draw(st.booleans()):
        labels["user/label"] = draw(label_values)
    meta: dict[str, Any] = {
        "name": "p-" + draw(st.text("abcdef0123", min_size=4, max_size=8)),
        "namespace": namespace,
        "labels": labels,
        # the controller its operator sets: a pod without one is not the job's (not injected)
        "ownerReferences": [
            pytorchjob_owner("job-x") if kind == "pytorch" else batch_job_owner("job-x")
        ],
    }
    if draw(st.booleans()):
        meta["annotations"] = draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "user/a",
                        "kubeckpt.io/interval",
                        "kubeckpt.io/max-checkpoints",
                        "kubeckpt.io/resume",
                        "kubeckpt.io/local-tier",
                        "kubeckpt.io/progress-push-ca",  # the webhook's to set (progress.push)
                    ]
                ),
                st.sampled_from(["10m", "5", "true", "nope", "0", "-1"]),
                max_size=3,
            )
        )
    volumes = draw(st.lists(vol_names, unique=True, max_size=3))
    target = "pytorch" if kind == "pytorch" else "node"
    names = draw(st.sampled_from([[target], ["side", target], [target, "side"], ["main"]]))
    spec: dict[str, Any] = {"containers": [draw(containers(n, volumes)) for n in names]}
    if volumes:
        spec["volumes"] = [{"name": v, "emptyDir": {}} for v in volumes]
    grace = draw(st.sampled_from([None, 0, 30, 45, 600]))
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@st.composite
def policies(draw: Any, namespace: str = "ns-x") -> dict[str, Any]:
    uri = draw(
        st.sampled_from(["pvc://claim/runs", "pvc://claim", "s3://bucket/p", "file:///shared/ckpt"])
    )
    spec: dict[str, Any] = {"storage": {"uri": uri}}
    if uri.startswith("s3") and draw(st.booleans()):
        spec["storage"]["secretRef"] = {"name": "creds"}
    if draw(st.booleans()):
        spec["localTier"] = {"enabled": True, "modelParameters": draw(st.integers(1, 10**11))}
    if draw(st.booleans()):
        spec["jit"] = {
            "enabled": draw(st.booleans()),
            "maxGracePeriodSeconds": draw(st.integers(30, 3600)),
        }
    if draw(st.booleans()):
        spec["strategy"], spec["saveSteps"] = "steps", draw(st.integers(1, 10_000))
    if draw(st.booleans()):
        spec["progress"] = {"push": True}
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {
            "name": "pol",
            "namespace": namespace,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }


progress = st.one_of(
    st.none(),
    st.builds(
        lambda s, v: {"status": {"stepSeconds": s, "checkpointing": {"lastSaveSeconds": v}}},
        st.sampled_from(["0.5", "3", "abc", None]),
        st.sampled_from(["1", "120", "1e9", "-5", None]),
    ),
)
