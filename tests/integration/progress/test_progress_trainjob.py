"""TrainJob support on the real control plane: the CRD installed while the controller runs is
noticed without a restart; status.trainerStatus is applied in Trainer's shape, and left alone
when another field manager owns it; a TrainJob's pods that should have been injected and were not
get the same one NotInjected Event and condition as a PyTorchJob's. The pods are owned as
Trainer and JobSet own them (pod -> batch Job -> JobSet -> TrainJob), made by hand here:
the controller counts no pod by its labels alone."""

from __future__ import annotations

import json

import pytest
from progress_support import (
    FAST,
    KWOK_KEEPS_RUNNING,
    controller_ref,
    event_counts,
    eventually,
    get_tp,
    install_jobset_crd,
    progress,
    running_controller,
    trainjob_batch_job,
    write_atomic,
)
from trainjob_support import (
    TRAINJOB_CRD,
    install_crd,
    stop_trainer,
    trainjob,
    trainjob_with_pod,
)

from localcluster import LocalCluster
from reconciler.client import Client


@pytest.fixture(autouse=True)
def no_trainer(cluster: LocalCluster) -> None:
    stop_trainer(cluster)


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
            install_jobset_crd(cluster)
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
        owner = trainjob_batch_job(cluster, ns, "bare-tj")
        for index in ("0", "1"):
            cluster.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"bare-tj-node-0-{index}",
                        "namespace": ns,
                        "ownerReferences": [controller_ref(owner)],
                        "annotations": KWOK_KEEPS_RUNNING,
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
