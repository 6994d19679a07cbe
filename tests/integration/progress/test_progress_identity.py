"""Job identity on the real control plane (issue 24, item 4 and 5 where the controller decides).

A pod is a job's only if the job's controller owns it: a bare pod labelled as a job's master
(anyone who may create pods in the namespace can make one) drives nothing of the job's
TrainingProgress, Events, rank-0 choice or pod annotations, and is reported once. A PyTorchJob
and a TrainJob of the same name get a TrainingProgress each, found by spec.jobRef; the CLI tells
them apart with --kind."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from progress_support import (
    FAST,
    cond,
    controller_ref,
    event_counts,
    eventually,
    get_json,
    get_tp,
    progress,
    pytorchjob,
    running_controller,
    start_job,
    write_atomic,
)
from trainjob_support import install_crd, stop_trainer, trainjob_pod, trainjob_with_pod

from localcluster import LocalCluster
from reconciler.client import Client
from reconciler.exec import exec_command
from tests.support.cli_objects import run_cli
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION as LAST_STEP,
)

WITHIN = 10.0  # a few FAST intervals, plus exec and watch latency on a busy machine


@pytest.fixture(autouse=True)
def no_trainer(cluster: LocalCluster) -> None:
    stop_trainer(cluster)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def checkpoint(step: int) -> dict[str, Any]:
    return {
        "enabled": True,
        "latestCheckpoint": f"/ckpt/checkpoint-{step}",
        "checkpointsCreated": 1,
        "latestCheckpointTime": now(),
    }


def forged_master(
    cluster: LocalCluster, ns: str, name: str, like: dict, record: bytes, owners: list[dict]
) -> None:
    """A pod that copies the labels of `like` (a real master pod), claims injection, serves
    `record`, and has these ownerReferences."""
    d = cluster.exec_dir(ns, name)
    write_atomic(d / "progress.json", record)
    labels = dict(like["metadata"]["labels"], **{"kubeckpt.io/injected": "true"})
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "ownerReferences": owners,
            },
            "spec": {
                "containers": [
                    {
                        "name": "pytorch",
                        "image": "busybox",
                        "env": [
                            {"name": "TRAINING_PROGRESS_FILE", "value": str(d / "progress.json")},
                            {"name": "PROGRESS_UPDATE_FREQUENCY", "value": "1"},
                        ],
                    }
                ]
            },
        }
    )


def annotations(cluster: LocalCluster, ns: str, pod: str) -> dict[str, str]:
    return get_json(cluster, "pod", pod, ns)["metadata"].get("annotations") or {}


class RecordingExec:
    def __init__(self) -> None:
        self.pods: list[str] = []

    async def __call__(self, *args: Any, **kw: Any) -> Any:
        self.pods.append(args[2])
        return await exec_command(*args, **kw)


async def test_a_label_forged_master_drives_nothing_and_is_reported(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    path = start_job(kwok, ns, "victim", progress(5))
    # A job whose pods were not injected: a forged injected master must not make it one.
    quiet = pytorchjob("quiet", ns, "/nowhere")
    quiet["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"] = {}
    kwok.apply(quiet)
    execs = RecordingExec()
    async with running_controller(client, FAST, exec_fn=execs) as ctrl:

        async def victim(step: int) -> dict | None:
            tp = await get_tp(client, ns, "victim")
            return tp if tp and (tp.get("status") or {}).get("step") == step else None

        await eventually(lambda: victim(5), "the real master's record", 90)
        real = get_json(kwok, "pod", "victim-master-0", ns)
        assert real["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
        # Newer than the real master (rank-0 choice prefers the newest), a later step, its own
        # checkpoint: everything that would have driven the job's status.
        hostile = progress(999, checkpointing=checkpoint(999), resumedFrom="/ckpt/checkpoint-1")
        forged_master(kwok, ns, "victim-master-forged", real, hostile, [])
        await eventually(
            lambda: kwok.kubectl(
                "get", "pod", "quiet-master-0", "-n", ns, "--ignore-not-found", "-o", "name"
            ).stdout.strip(),
            "the quiet job's master",
            60,
        )
        quiet_master = get_json(kwok, "pod", "quiet-master-0", ns)
        forged_master(kwok, ns, "quiet-master-forged", quiet_master, hostile, [])

        async def foreign() -> dict | None:
            tp = await get_tp(client, ns, "victim")
            c = cond(tp or {}, "PodsOwned")
            return tp if c.get("status") == "False" else None

        tp = await eventually(foreign, "PodsOwned=False", WITHIN)
        c = cond(tp, "PodsOwned")
        assert c["reason"] == "ForeignPod" and "victim-master-forged" in c["message"], c

        # The real master still drives it: its next record, its checkpoint, its pod name.
        write_atomic(path, progress(6, checkpointing=checkpoint(6)))
        tp = await eventually(lambda: victim(6), "the real master's next record", WITHIN)
        st = tp["status"]
        assert st["observedPod"] == "victim-master-0"
        assert st["checkpointing"]["latestCheckpoint"] == "/ckpt/checkpoint-6"
        assert "resumedFrom" not in st
        await eventually(
            lambda: annotations(kwok, ns, "victim-master-0").get(LAST_STEP) == "6",
            "the real master's last-checkpoint annotation",
            WITHIN,
        )
        reads = ctrl.stats["reads"]
        await eventually(lambda: ctrl.stats["reads"] >= reads + 3, "more reads", WITHIN)
        assert "victim-master-forged" not in execs.pods and "quiet-master-forged" not in execs.pods
        assert LAST_STEP not in annotations(kwok, ns, "victim-master-forged")
        # Reported once each (the condition remembers it; the quiet job, which has no
        # TrainingProgress, by the controller's memory).
        assert event_counts(kwok, ns, "victim").get("ForeignPod") == 1
        assert event_counts(kwok, ns, "quiet").get("ForeignPod") == 1
        assert await get_tp(client, ns, "quiet") is None
        events = json.loads(kwok.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        reported = [e["message"] for e in events if e["reason"] == "ForeignPod"]
        assert any("victim-master-forged: the pod has no controller" in m for m in reported)

        # The forged pod goes: every pod with the job's labels is its own again.
        kwok.kubectl("delete", "pod", "victim-master-forged", "-n", ns, "--wait=false")

        async def owned_again() -> bool:
            tp = await get_tp(client, ns, "victim")
            return cond(tp or {}, "PodsOwned").get("status") == "True"

        await eventually(owned_again, "PodsOwned=True", WITHIN * 2)

    # A restarted controller does not report the forged pods again.
    async with running_controller(client, FAST) as ctrl2:
        await eventually(lambda: ctrl2.stats["reads"] >= 2, "a few reads", WITHIN * 2)
        await asyncio.sleep(1.0)
        assert event_counts(kwok, ns, "victim").get("ForeignPod") == 1


async def test_a_trainjobs_pods_are_its_own_through_job_and_jobset(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    """The chain Trainer and JobSet make: pod -> batch Job -> JobSet -> TrainJob. A pod with
    the labels but no owner, or owned by a batch Job the tenant made, is foreign."""
    ns = namespace
    install_crd(cluster)
    try:
        path = trainjob_with_pod(cluster, ns, "tj", progress(10))
        async with running_controller(client, FAST, trainjob_interval=0.5) as ctrl:

            async def tj(step: int) -> dict | None:
                tp = await get_tp(client, ns, "tj")
                return tp if tp and (tp.get("status") or {}).get("step") == step else None

            await eventually(lambda: tj(10), "the TrainJob's record", 90)
            # A batch Job of the tenant's own, owned by nothing.
            cluster.apply(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "tenant", "namespace": ns},
                    "spec": {
                        "managedBy": "kubeckpt.io/tests",
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "node", "image": "busybox"}],
                            }
                        },
                    },
                }
            )
            tenant = get_json(cluster, "jobs.batch", "tenant", ns)
            bad = progress(999, checkpointing=checkpoint(999))
            trainjob_pod(cluster, ns, "tj", "tj-forged-bare", bad, [])
            trainjob_pod(cluster, ns, "tj", "tj-forged-job", bad, [controller_ref(tenant)])

            async def foreign() -> dict | None:
                tp = await get_tp(client, ns, "tj")
                c = cond(tp or {}, "PodsOwned")
                both = "tj-forged-bare" in c.get("message", "") and "tj-forged-job" in c.get(
                    "message", ""
                )
                return c if c.get("status") == "False" and both else None

            await eventually(foreign, "both forged pods reported", WITHIN)
            write_atomic(path, progress(11))
            tp = await eventually(lambda: tj(11), "the real pod's next record", WITHIN)
            assert tp["status"]["observedPod"] == "tj-node-0-0"
            counts = event_counts(cluster, ns, "tj", "TrainJob")
            assert counts.get("ForeignPod") in (1, 2), counts  # one Event per reconcile's news
            events = json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)
            text = " ".join(e["message"] for e in events["items"] if e["reason"] == "ForeignPod")
            assert "tj-forged-job: its Job tenant has no controller" in text, text
            assert "tj-forged-bare: the pod has no controller" in text, text
            # One GET per Job and JobSet of the real chain, and one for the tenant's Job.
            assert ctrl.owners.fetches == 3, ctrl.owners.fetches
    finally:
        cluster.kubectl(
            "delete", "crd", "trainjobs.trainer.kubeflow.org", "--wait=false", check=False
        )


async def test_same_named_pytorchjob_and_trainjob_get_a_progress_each(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    install_crd(kwok)
    try:
        start_job(kwok, ns, "llama", progress(5))
        async with running_controller(client, FAST, trainjob_interval=0.5):
            # The PyTorchJob came first: it keeps the plain name.
            async def step(name: str, value: int) -> dict | None:
                tp = await get_tp(client, ns, name)
                return tp if tp and (tp.get("status") or {}).get("step") == value else None

            await eventually(lambda: step("llama", 5), "the PyTorchJob's progress", 90)
            tj_path = trainjob_with_pod(kwok, ns, "llama", progress(50))
            tj = await eventually(lambda: step("llama-trainjob", 50), "the TrainJob's", 30)
            pt = await get_tp(client, ns, "llama")
            assert pt is not None
            ptj = get_json(kwok, "pytorchjob", "llama", ns)
            tjob = get_json(kwok, "trainjobs.trainer.kubeflow.org", "llama", ns)
            for tp, job in ((pt, ptj), (tj, tjob)):
                assert tp["spec"]["jobRef"] == {
                    "apiVersion": job["apiVersion"],
                    "kind": job["kind"],
                    "name": "llama",
                }
                (owner,) = tp["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["uid"], owner["controller"]) == (
                    job["kind"],
                    job["metadata"]["uid"],
                    True,
                )
            assert pt["status"]["observedPod"] == "llama-master-0"
            assert tj["status"]["observedPod"] == "llama-node-0-0"
            named = sorted(
                (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["message"])
                for e in json.loads(kwok.kubectl("get", "events", "-n", ns, "-o", "json").stdout)[
                    "items"
                ]
                if e["reason"] == "TrainingProgressName"
            )
            # Once on the TrainJob and once on its TrainingProgress (`kubectl describe tp`).
            message = (
                "this TrainJob's TrainingProgress is llama-trainjob: llama belongs to another "
                "job of the same name"
            )
            assert named == [
                ("TrainJob", "llama", message),
                ("TrainingProgress", "llama-trainjob", message),
            ], named
            # Each is written from its own pod only.
            write_atomic(tj_path, progress(51))
            await eventually(lambda: step("llama-trainjob", 51), "the TrainJob's next", WITHIN)
            assert (await get_tp(client, ns, "llama") or {})["status"]["step"] == 5

            # The CLI resolves the name through spec.jobRef and asks which one.
            kc = ("--kubeconfig", str(kwok.kubeconfig), "-n", ns)
            both = run_cli(*kc, "status", "llama")
            assert both.returncode == 2, both
            assert both.stderr == (
                f'kubeckpt: several jobs are named "llama" in namespace "{ns}" '
                "(PyTorchJob, TrainJob): choose one with --kind\n"
            )
            one = run_cli(*kc, "status", "llama", "--kind", "TrainJob", "-o", "json")
            assert one.returncode == 0, one.stderr
            doc = json.loads(one.stdout)
            assert (doc["name"], doc["kind"], doc["step"]) == ("llama", "TrainJob", 51)
            table = run_cli(*kc, "status").stdout.splitlines()
            assert sorted(line.split()[:2] for line in table[1:]) == [
                ["llama", "PyTorchJob"],
                ["llama", "TrainJob"],
            ], table
            described = run_cli(*kc, "describe", "llama", "--kind", "PyTorchJob")
            assert described.returncode == 0, described.stderr
            assert "PyTorchJob llama" in described.stdout and "llama-master-0" in described.stdout

        # A restarted controller finds both by jobRef: no third object, no second Event.
        async with running_controller(client, FAST, trainjob_interval=0.5) as ctrl:
            await eventually(lambda: ctrl.stats["reads"] >= 4, "a few reads", WITHIN * 2)
        names = kwok.kubectl("get", "tp", "-n", ns, "-o", "name").stdout.split()
        assert sorted(names) == [
            "trainingprogress.kubeckpt.io/llama",
            "trainingprogress.kubeckpt.io/llama-trainjob",
        ]
        assert event_counts(kwok, ns, "llama", "TrainJob").get("TrainingProgressName") == 1
    finally:
        kwok.kubectl("delete", "crd", "trainjobs.trainer.kubeflow.org", "--wait=false", check=False)
