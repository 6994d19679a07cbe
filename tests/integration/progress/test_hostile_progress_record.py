"""A hostile progress record on a KWOK pod (issue 24, item 3, the controller's side): huge
stepSeconds and lastSaveSeconds, a checkpoint time far in the future. Before, the stepSeconds made
the next poll centuries away (the job was never read again nor found Stalled) and the time went
onto the pods as is. Now the values are left out and named in ValuesInRange, the job is still
read at its interval, and the pods carry only what is believable."""

from __future__ import annotations

import time

from progress_support import (
    cond,
    eventually,
    get_json,
    get_tp,
    progress,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION as LAST_STEP,
)
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_TIME_ANNOTATION as LAST_TIME,
)

WITHIN = 10.0  # a few FAST (1 s) intervals, plus exec and watch latency on a busy machine


async def test_a_hostile_record_sizes_nothing_and_the_job_is_still_read(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    hostile = {
        "enabled": True,
        "latestCheckpoint": "/ckpt/hostile/checkpoint-3",
        "latestCheckpointTime": "2999-01-01T00:00:00Z",
        "lastSaveSeconds": "1e300",
    }
    path = start_job(kwok, ns, "hostile", progress(3, stepSeconds="1e300", checkpointing=hostile))
    async with running_controller(client) as ctrl:

        async def at(step: int) -> dict | None:
            tp = await get_tp(client, ns, "hostile")
            return tp if tp and (tp.get("status") or {}).get("step") == step else None

        tp = await eventually(lambda: at(3), "the hostile record", 90)
        st = tp["status"]
        c = cond(tp, "ValuesInRange")
        assert (c["status"], c["reason"]) == ("False", "ValueOutOfRange"), c
        for field in (
            "stepSeconds 1e300",
            "checkpointing.latestCheckpointTime 2999-01-01T00:00:00Z",
            "checkpointing.lastSaveSeconds 1e300",
        ):
            assert field in c["message"], c["message"]
        assert "stepSeconds" not in st
        assert "lastSaveSeconds" not in st["checkpointing"]
        assert "latestCheckpointTime" not in st["checkpointing"]
        assert cond(tp, "Progressing")["status"] == "True"  # the rest of the record counts
        # The pods carry the step, not the time from the future.
        await eventually(
            lambda: (
                (
                    get_json(kwok, "pod", "hostile-master-0", ns)["metadata"].get("annotations")
                    or {}
                ).get(LAST_STEP)
                == "3"
            ),
            "the checkpoint's step on the pod",
            WITHIN,
        )
        pod = get_json(kwok, "pod", "hostile-master-0", ns)
        assert LAST_TIME not in (pod["metadata"].get("annotations") or {})

        # Still read at its interval: each new step is followed (stepSeconds 1e300 used to put
        # the next read out of reach).
        for step in (4, 5):
            write_atomic(path, progress(step, stepSeconds="1e300", checkpointing=hostile))
            t0 = time.monotonic()
            await eventually(lambda s=step: at(s), f"step {step}", WITHIN)
            assert time.monotonic() - t0 <= WITHIN
        assert ctrl._state[f"{ns}/hostile"].next_poll - ctrl.clock.now() <= 2.0

        # A sound record: used again, and the condition says so.
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sound = dict(hostile, latestCheckpointTime=now, lastSaveSeconds="2.5")
        write_atomic(path, progress(6, stepSeconds="0.01", checkpointing=sound))
        tp = await eventually(lambda: at(6), "the sound record", WITHIN)
        c = cond(tp, "ValuesInRange")
        assert (c["status"], c["reason"]) == ("True", "ValuesInRange"), c
        assert tp["status"]["stepSeconds"] == "0.01"
        assert tp["status"]["checkpointing"]["lastSaveSeconds"] == "2.5"
        await eventually(
            lambda: (
                (
                    get_json(kwok, "pod", "hostile-master-0", ns)["metadata"].get("annotations")
                    or {}
                ).get(LAST_TIME)
                == now
            ),
            "the believable time on the pod",
            WITHIN,
        )
