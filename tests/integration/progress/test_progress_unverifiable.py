"""A training process that found checkpoints of which none verifies (issue 27): its record names
them (checkpointing.unverifiableCheckpoints) and the controller shows the TrainingProgress
condition CheckpointsUnverifiable with one Warning Event naming the bad files; the runtime's text
arrives escaped and bounded. On the real control plane (KWOK pods)."""

from __future__ import annotations

from progress_support import eventually, get_tp, job_events, progress, running_controller, start_job

from localcluster import LocalCluster
from reconciler.client import Client

NAMED = (
    "none of 2 checkpoints verifies; not starting from step 0: "
    "/ckpt/checkpoint-14: checksum mismatch: model.pt: expected xxh3_128 aa, got bb; "
    "/ckpt/checkpoint-7: missing file: model.pt\x1b[2J"
)


async def test_the_bad_checkpoints_are_named_in_a_condition_and_an_event(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns, job = namespace, "unverifiable"
    bad = {"reason": "CheckpointsUnverifiable", "message": NAMED}
    ck = {"enabled": True, "unverifiableCheckpoints": bad}
    start_job(kwok, ns, job, progress(0, incarnation="a", checkpointing=ck))

    async def unverifiable() -> dict | None:
        st = ((await get_tp(client, ns, job)) or {}).get("status") or {}
        found = [c for c in st.get("conditions") or [] if c["type"] == "CheckpointsUnverifiable"]
        return found[0] if found else None

    async with running_controller(client):
        cond = await eventually(unverifiable, "the CheckpointsUnverifiable condition", 90)
        assert (cond["status"], cond["reason"]) == ("True", "CheckpointsUnverifiable"), cond
        assert "/ckpt/checkpoint-14: checksum mismatch: model.pt" in cond["message"], cond
        assert "/ckpt/checkpoint-7: missing file: model.pt" in cond["message"], cond
        assert "\x1b" not in cond["message"], cond

        async def warned() -> list[dict]:
            return [
                e
                for e in job_events(kwok, ns, job, "TrainingProgress")
                if e["reason"] == "CheckpointsUnverifiable"
            ]

        (event,) = await eventually(warned, "the CheckpointsUnverifiable Event", 30)
        assert event["type"] == "Warning" and "checkpoint-14" in event["message"], event
