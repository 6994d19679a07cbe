"""A TrainJob's rank-0 pod deleted while its Job's replacement is already there, on the real
control plane: the pod being deleted (a finalizer keeps it in the API, as a kubelet does while
the grace period runs) writes its just-in-time checkpoint and exits, while the replacement is
Pending (a scheduling gate). The controller reads the victim, by exec and then its termination
message, so the JITCheckpoint Event comes from it; once the replacement runs and reports, its
record wins and the victim's is not taken again, although the replacement resumed lower."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from progress_support import (
    FAST,
    controller_ref,
    event_counts,
    eventually,
    get_tp,
    progress,
    running_controller,
    trainjob_batch_job,
    write_atomic,
)
from trainjob_support import install_crd, stop_trainer, trainjob_pod

from localcluster import LocalCluster
from reconciler.client import Client

HOLD = "kubeckpt.io/test-hold"
GATE = "kubeckpt.io/test-gate"


@pytest.fixture(autouse=True)
def no_trainer(cluster: LocalCluster) -> None:
    stop_trainer(cluster)


def checkpointing(step: int, reason: str) -> dict:
    return {
        "enabled": True,
        "latestCheckpoint": f"/ckpt/checkpoint-{step}",
        "latestCheckpointReason": reason,
        "checkpointsCreated": 1,
    }


async def test_the_victims_jit_checkpoint_is_read_before_its_replacement(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    ns, name = namespace, "vjit"
    victim, repl = f"{name}-node-0-0-a", f"{name}-node-0-0-b"

    async def status() -> dict:
        return ((await get_tp(client, ns, name)) or {}).get("status") or {}

    def events() -> dict[str, int]:
        return event_counts(cluster, ns, name, "TrainJob")

    try:
        install_crd(cluster)
        cluster.apply(
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": name, "namespace": ns},
                "spec": {},
            }
        )
        owners = [controller_ref(trainjob_batch_job(cluster, ns, name))]
        first = progress(40, checkpointing=checkpointing(40, "periodic"))
        path = trainjob_pod(cluster, ns, name, victim, first, owners, finalizers=(HOLD,))
        async with running_controller(client, FAST, trainjob_interval=0.5):

            async def at(step: int, pod: str) -> dict | None:
                st = await status()
                return st if (st.get("step"), st.get("observedPod")) == (step, pod) else None

            await eventually(lambda: at(40, victim), "the victim's first record", 90)
            # Deleted: it stays in the API (the finalizer) and its container runs on; the Job's
            # replacement is there at once, Pending.
            cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
            # It resumed from checkpoint-40 (as if the JIT save below had failed), at step 41.
            resumed = progress(
                41,
                resumedFrom="/ckpt/checkpoint-40",
                checkpointing=dict(checkpointing(40, "resume"), checkpointsCreated=0),
            )
            trainjob_pod(cluster, ns, name, repl, resumed, owners, scheduling_gates=(GATE,))
            # The victim saves on the way out; read by exec, before the Pending replacement.
            jit = progress(45, checkpointing=checkpointing(45, "jit"))
            write_atomic(path, jit)
            st = await eventually(lambda: at(45, victim), "the victim's JIT record by exec", 30)
            assert st["source"] == "exec", st
            await eventually(lambda: events().get("JITCheckpoint") == 1, "JITCheckpoint", 10)

            # It exits with its final record in its termination message.
            pod = json.loads(cluster.kubectl("get", "pod", victim, "-n", ns, "-o", "json").stdout)
            assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
            cs = pod["status"]["containerStatuses"][0]
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            final = progress(45, checkpointing=checkpointing(45, "jit"))
            cs.update(
                ready=False,
                started=False,
                state={
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "message": final.decode(),
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            )
            cluster.kubectl(
                "patch",
                "pod",
                victim,
                "-n",
                ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": {"phase": "Failed", "containerStatuses": [cs]}}),
            )

            async def from_message() -> dict | None:
                st = await at(45, victim)
                return st if st and st.get("source") == "terminationMessage" else None

            await eventually(from_message, "the victim's termination message", 30)

            # The replacement starts; resumed lower than the victim's last step, its record wins
            # all the same.
            cluster.kubectl(
                "patch",
                "pod",
                repl,
                "-n",
                ns,
                "--type=json",
                "-p",
                json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
            )
            await eventually(lambda: at(41, repl), "the replacement's record", 60)
            await eventually(lambda: events().get("Resumed") == 1, "Resumed", 10)
            # The victim is still there with its step-45 message: never taken again.
            for _ in range(5):
                await asyncio.sleep(FAST.early)
                st = await status()
                assert (st.get("step"), st.get("observedPod")) == (41, repl), st
            assert events().get("JITCheckpoint") == 1, events()
    finally:
        cluster.kubectl(
            "patch",
            "pod",
            victim,
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"finalizers": None}}),
            check=False,
        )
        cluster.kubectl(
            "delete", "crd", "trainjobs.trainer.kubeflow.org", "--wait=false", check=False
        )
