"""The job's life on the real control plane: the master pod replaced, a controller restart (no
duplicate Events), per-job gauges, the final record from the termination message and Completed,
and two replicas of which only the leader reads and writes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from progress_support import (
    FAST,
    admin_config,
    cond,
    event_counts,
    eventually,
    get_tp,
    progress,
    record_writes,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from progress_controller.controller import ProgressController
from reconciler.client import Client
from reconciler.leaderelection import LeaderElectionConfig
from reconciler.manager import Manager

WITHIN = 6.0


async def status(client: Client, ns: str, name: str) -> dict:
    tp = await get_tp(client, ns, name)
    return (tp or {}).get("status") or {}


def master_uid(cluster: LocalCluster, ns: str, job: str) -> str | None:
    p = cluster.kubectl("get", "pod", f"{job}-master-0", "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout)["metadata"]["uid"] if p.returncode == 0 else None


async def test_replaced_pod_restart_gauges_and_completion(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    ck = {"enabled": True, "latestCheckpoint": "/ckpt/checkpoint-40", "checkpointsCreated": 1}
    path = start_job(kwok, ns, "life", progress(50, checkpointing=ck))
    async with running_controller(client) as ctrl:
        await eventually(lambda: _step(client, ns, "life", 50), "the first record", 90)
        # The master pod is deleted; the operator makes a new one (same name, new uid) that
        # starts over from the checkpoint: a resume, not an error.
        old_uid = master_uid(kwok, ns, "life")
        kwok.kubectl("delete", "pod", "life-master-0", "-n", ns, "--wait=false")
        await eventually(
            lambda: master_uid(kwok, ns, "life") not in (None, old_uid), "a new master pod", 60
        )
        write_atomic(path, progress(41, checkpointing=ck))
        await eventually(lambda: _step(client, ns, "life", 41), "the new pod's record", 60)
        st = await status(client, ns, "life")
        assert cond({"status": st}, "Progressing")["status"] == "True", st
        await eventually(
            lambda: event_counts(kwok, ns, "life").get("Resumed") == 1, "one Resumed event", 10
        )
        # gauges for the job while it exists
        text = ctrl.manager.metrics.exposition().decode()
        assert f'kubeckpt_training_step{{job="life",namespace="{ns}"}} 41.0' in text, text
    before = event_counts(kwok, ns, "life")
    assert before.get("CheckpointSaved") == 1, before
    # The same Events on the TrainingProgress, where `kubectl describe tp` shows them.
    on_tp = event_counts(kwok, ns, "life", kind="TrainingProgress")
    assert (on_tp.get("CheckpointSaved"), on_tp.get("Resumed")) == (1, 1), on_tp
    described = kwok.kubectl("describe", "tp", "life", "-n", ns).stdout
    assert "Resumed" in described[described.index("Events:") :], described

    # A restarted controller reads the same file and stored status: no new Events.
    async with running_controller(client) as ctrl2:
        writes = record_writes(ctrl2, ns)
        await eventually(lambda: ctrl2.stats["reads"] >= 3, "a few reads", 20)
        assert len(writes) <= 1, writes  # lastPollTime is not a change on its own
        await asyncio.sleep(1.0)
        assert event_counts(kwok, ns, "life") == before
        assert event_counts(kwok, ns, "life", kind="TrainingProgress") == on_tp

        # The container terminates with the final record in its termination message; the
        # operator marks the job Succeeded: Completed, once.
        final = progress(60, checkpointing=dict(ck, latestCheckpoint="/ckpt/checkpoint-60"))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod = json.loads(kwok.kubectl("get", "pod", "life-master-0", "-n", ns, "-o", "json").stdout)
        cs = pod["status"]["containerStatuses"][0]
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
        kwok.kubectl(
            "patch",
            "pod",
            "life-master-0",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Succeeded", "containerStatuses": [cs]}}),
        )

        async def completed() -> dict | None:
            st = await status(client, ns, "life")
            ok = (
                st.get("step") == 60
                and st.get("source") == "terminationMessage"
                and cond({"status": st}, "Completed").get("status") == "True"
            )
            return st if ok else None

        st = await eventually(completed, "Completed from the termination message", 60)
        assert cond({"status": st}, "Progressing")["status"] == "False"
        await eventually(
            lambda: event_counts(kwok, ns, "life").get("Completed") == 1, "Completed event", 10
        )
        # The job goes: its gauges go too.
        kwok.kubectl("delete", "pytorchjob", "life", "-n", ns, "--wait=false")

        def no_gauges() -> bool:
            return 'job="life"' not in ctrl2.manager.metrics.exposition().decode()

        await eventually(no_gauges, "the job's gauges to go", 30)
    assert event_counts(kwok, ns, "life").get("Completed") == 1


async def _step(client: Client, ns: str, name: str, step: int) -> bool:
    return (await status(client, ns, name)).get("step") == step


async def test_two_replicas_only_the_leader_reads_and_writes(
    kwok: LocalCluster, namespace: str
) -> None:
    ns = namespace
    lease_ns = f"{ns}"
    path = start_job(kwok, ns, "ha", progress(1))
    clients = [Client(admin_config(kwok)) for _ in range(2)]
    managers, ctrls, tasks = [], [], []
    try:
        for i, c in enumerate(clients):
            m = Manager(
                c,
                name=f"r{i}",
                port=None,
                drain_timeout=1.0,
                leader_election=LeaderElectionConfig(
                    "kubeckpt-reconciler",
                    lease_ns,
                    identity=f"r{i}",
                    lease_duration=4.0,
                    renew_deadline=3.0,
                    retry_period=0.5,
                ),
            )
            managers.append(m)
            ctrls.append(ProgressController(m, settings=FAST))
            tasks.append(asyncio.create_task(m.run()))
        await eventually(lambda: any(m.is_leader for m in managers), "a leader", 30)
        leader = next(i for i, m in enumerate(managers) if m.is_leader)
        other = 1 - leader
        await eventually(lambda: _step(clients[0], ns, "ha", 1), "the first record", 90)
        for step in (2, 3):
            write_atomic(path, progress(step))
            await eventually(lambda s=step: _step(clients[0], ns, "ha", s), f"step {step}", WITHIN)
        # Waited for, not asserted at once: the GET above can see step 3 stored before the
        # leader has resumed from its apply call to count the write.
        await eventually(
            lambda: ctrls[leader].stats["reads"] >= 3 and ctrls[leader].stats["writes"] >= 3,
            "the leader's reads and writes counted",
            10,
        )
        assert ctrls[other].stats == {
            "reads": 0,
            "writes": 0,
            "skipped_writes": 0,
            "annotation_writes": 0,
        }
        assert ctrls[other].limiter.total == 0

        # The leader stops (releasing the Lease): the other takes over and follows the file.
        managers[leader].stop()
        await asyncio.wait_for(tasks[leader], 30)
        await eventually(lambda: managers[other].is_leader, "the takeover", 30)
        write_atomic(path, progress(4))
        await eventually(lambda: _step(clients[0], ns, "ha", 4), "step 4 via the new leader", 20)
        assert ctrls[other].stats["reads"] >= 1
    finally:
        for m in managers:
            m.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()
