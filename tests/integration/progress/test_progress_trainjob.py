"""TrainJob support on the real control plane: the CRD installed while the controller runs is
noticed without a restart; status.trainerStatus is applied in Trainer's shape, and left alone
when another field manager owns it; a TrainJob's pods that should have been injected and were not
get the same one NotInjected Event and condition as a PyTorchJob's."""

from __future__ import annotations

import json

import pytest
from progress_support import (
    FAST,
    event_counts,
    eventually,
    get_tp,
    progress,
    running_controller,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client

TRAINJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
    "spec": {
        "group": "trainer.kubeflow.org",
        "scope": "Namespaced",
        "names": {
            "kind": "TrainJob",
            "plural": "trainjobs",
            "singular": "trainjob",
            "listKind": "TrainJobList",
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "trainerStatus": {
                                        "type": "object",
                                        "properties": {
                                            "progressPercentage": {
                                                "type": "integer",
                                                "format": "int32",
                                                "minimum": 0,
                                                "maximum": 100,
                                            },
                                            "estimatedRemainingSeconds": {
                                                "type": "integer",
                                                "format": "int32",
                                                "minimum": 0,
                                            },
                                            "metrics": {
                                                "type": "array",
                                                "x-kubernetes-list-type": "atomic",
                                                "items": {
                                                    "type": "object",
                                                    "required": ["name", "value"],
                                                    "properties": {
                                                        "name": {"type": "string", "minLength": 1},
                                                        "value": {"type": "string", "minLength": 1},
                                                    },
                                                },
                                            },
                                            "lastUpdatedTime": {
                                                "type": "string",
                                                "format": "date-time",
                                            },
                                        },
                                    }
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(autouse=True)
def no_trainer(cluster: LocalCluster) -> None:
    """These tests install a TrainJob CRD of their own, and the first one needs none installed:
    Kubeflow Trainer (started by the real-node tests) goes, with its CRD."""
    if cluster.trainer.started:  # its TrainJobs' finalizers need Trainer to go
        cluster.kubectl(
            "delete", "trainjobs", "-A", "--all", "--timeout=60s", check=False, timeout=90
        )
    cluster.stop_trainer()
    cluster.kubectl(
        "delete",
        "crd",
        "trainjobs.trainer.kubeflow.org",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
        check=False,
        timeout=90,
    )


def trainjob_with_pod(
    cluster: LocalCluster, ns: str, name: str, first: bytes, env: tuple[dict, ...] = ()
):
    cluster.apply(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {},
        }
    )
    pod = f"{name}-node-0-0"
    d = cluster.exec_dir(ns, pod)
    write_atomic(d / "progress.json", first)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": ns,
                "labels": {
                    "kubeckpt.io/injected": "true",
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/job-index": "0",
                    "batch.kubernetes.io/job-completion-index": "0",
                },
            },
            "spec": {
                "containers": [
                    {
                        "name": "node",
                        "image": "busybox",
                        "env": [
                            {"name": "TRAINING_PROGRESS_FILE", "value": str(d / "progress.json")},
                            *env,
                        ],
                    }
                ]
            },
        }
    )
    return d / "progress.json"


def trainjob(cluster: LocalCluster, ns: str, name: str) -> dict:
    out = cluster.kubectl(
        "get", "trainjob", name, "-n", ns, "-o", "json", "--show-managed-fields"
    ).stdout
    return json.loads(out)


async def test_trainjob_noticed_later_and_trainer_status(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    try:
        async with running_controller(client, FAST, trainjob_interval=0.5) as ctrl:
            assert ctrl.trainjobs.informer is None
            cluster.apply(TRAINJOB_CRD)
            cluster.kubectl(
                "wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org"
            )
            path = trainjob_with_pod(cluster, ns, "tj", progress(10, percentComplete="10.0"))
            theirs = trainjob_with_pod(cluster, ns, "owned", progress(3))
            # Trainer's TrainJobStatus gate on: it injected its status server's URL, so its own
            # status server (KubeflowCallback in the pod) writes trainerStatus, not us.
            server = {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "https://trainer:10443/x"}
            trainjob_with_pod(cluster, ns, "gated", progress(5), env=(server,))
            # Someone else (Trainer itself) owns owned's trainerStatus.
            cluster.kubectl(
                "apply",
                "--server-side",
                "--field-manager=trainer",
                "--subresource=status",
                "-f",
                "-",
                input=json.dumps(
                    {
                        "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "kind": "TrainJob",
                        "metadata": {"name": "owned", "namespace": ns},
                        "status": {
                            "trainerStatus": {
                                "progressPercentage": 7,
                                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                            }
                        },
                    }
                ),
            )

            def trainer(name: str, pct: int) -> dict | None:
                ts = (trainjob(cluster, ns, name).get("status") or {}).get("trainerStatus") or {}
                return ts if ts.get("progressPercentage") == pct else None

            ts = await eventually(lambda: trainer("tj", 10), "trainerStatus", 90)
            metrics = {m["name"]: m["value"] for m in ts["metrics"]}
            assert metrics["currentStep"] == "10" and metrics["loss"]
            assert ts["estimatedRemainingSeconds"] == 300
            tp = await get_tp(client, ns, "tj")
            assert tp is not None and tp["spec"]["jobRef"] == {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "name": "tj",
            }
            write_atomic(path, progress(20, percentComplete="20.0"))
            await eventually(lambda: trainer("tj", 20), "trainerStatus follows", 10)

            # The other owner's trainerStatus stays; our TrainingProgress still follows.
            async def owned_tp_step(step: int) -> bool:
                tp = await get_tp(client, ns, "owned")
                return bool(tp) and (tp.get("status") or {}).get("step") == step

            await eventually(lambda: owned_tp_step(3), "owned's TrainingProgress", 30)
            write_atomic(theirs, progress(4))
            await eventually(lambda: owned_tp_step(4), "owned's TrainingProgress", 10)
            assert trainer("owned", 7) is not None
            managers = {
                f["manager"]
                for f in trainjob(cluster, ns, "owned")["metadata"]["managedFields"]
                if f.get("subresource") == "status"
            }
            assert managers == {"trainer"}

            async def gated_tp() -> bool:
                tp = await get_tp(client, ns, "gated")
                return bool(tp) and (tp.get("status") or {}).get("step") == 5

            await eventually(gated_tp, "gated's TrainingProgress", 30)
            assert "trainerStatus" not in (trainjob(cluster, ns, "gated").get("status") or {})
    finally:
        cluster.kubectl(
            "delete", "crd", "trainjobs.trainer.kubeflow.org", "--wait=false", check=False
        )


def install_crd(cluster: LocalCluster) -> None:
    # A previous test's CRD may still be terminating: applying over it would not bring it back.
    cluster.kubectl(
        "wait", "--for=delete", "crd/trainjobs.trainer.kubeflow.org", "--timeout=60s", check=False
    )
    cluster.apply(TRAINJOB_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org")


async def test_not_injected_trainjob_pods(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    """As if the webhook were down (it fails open): JobSet's pods of a TrainJob are created
    without the marker in a namespace that opted in, with a matching CheckpointPolicy."""
    ns = namespace
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    cluster.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"storage": {"uri": "file:///tmp/ckpt"}},
        }
    )

    def tj_events() -> dict[str, int]:
        return event_counts(cluster, ns, "bare-tj", "TrainJob")

    try:
        install_crd(cluster)
        cluster.apply(
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": "bare-tj", "namespace": ns},
                "spec": {},
            }
        )
        for index in ("0", "1"):
            cluster.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"bare-tj-node-0-{index}",
                        "namespace": ns,
                        "labels": {
                            "jobset.sigs.k8s.io/jobset-name": "bare-tj",
                            "jobset.sigs.k8s.io/job-index": "0",
                            "batch.kubernetes.io/job-completion-index": index,
                        },
                    },
                    "spec": {"containers": [{"name": "node", "image": "busybox"}]},
                }
            )

        async def not_injected() -> dict | None:
            tp = await get_tp(client, ns, "bare-tj")
            conds = ((tp or {}).get("status") or {}).get("conditions") or []
            c = next((c for c in conds if c["type"] == "Injected"), {})
            return c if c.get("status") == "False" else None

        for run in range(2):  # the second run is a restarted controller: no second Event
            async with running_controller(client, FAST, trainjob_interval=0.5) as ctrl:
                c = await eventually(not_injected, "Injected=False", 90)
                assert c["reason"] == "PodsNotInjected", c
                assert "bare-tj-node-0-0" in c["message"] and "bare-tj-node-0-1" in c["message"]
                await eventually(
                    lambda: tj_events().get("NotInjected") == 1,
                    "one NotInjected event",
                    10,
                )
                if run == 1:
                    await eventually(lambda: ctrl.stats["skipped_writes"] >= 1, "a reconcile", 10)
        assert tj_events()["NotInjected"] == 1
        tp = await get_tp(client, ns, "bare-tj")
        assert tp is not None and tp["spec"]["jobRef"]["kind"] == "TrainJob"
    finally:
        cluster.kubectl("delete", "crd", "trainjobs.trainer.kubeflow.org", "--timeout=60s")
