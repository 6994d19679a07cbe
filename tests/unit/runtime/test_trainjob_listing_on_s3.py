"""`kubeckpt checkpoints` for a TrainJob on s3:// storage, without a cluster: what the rank-0
`node` container lists (the env the webhook gave it: the kind's own prefix, the Secret's
credentials, here the session's SeaweedFS) and how the CLI shows it beside the TrainJob's
TrainingProgress. The listing runs in the pod over pods/exec; its inputs are the same here.
With the runtime's tests, not tests/unit/cli: it needs the `s3` extra, which the CLI's
lowest-versions run (hack/test-lowest-deps.sh) does not install."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kubeckpt_cli import checkpoints as ck
from localcluster.seaweedfs import SeaweedFS
from tests.support.cli_objects import tp, training_status
from tests.support.operator_pods import operator_pod
from tests.support.s3 import BUCKET
from trainer_runtime import listing
from trainer_runtime.contract import INCOMPLETE_SENTINEL, build_manifest
from webhook.mutation import mutate

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}


def test_trainjob_checkpoints_on_s3_listed_with_reasons_and_resume(
    seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    policy = {
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"storage": {"uri": prefix, "secretRef": {"name": "s3"}}},
    }
    pod = mutate(operator_pod("TrainJob", "llama", "team-a"), policy, NS).pod
    node = pod["spec"]["containers"][0]
    assert ck.container_of(pod, "TrainJob") == "node"
    uri = next(e["value"] for e in node["env"] if e["name"] == "CHECKPOINT_URI")
    assert uri == f"{prefix}/team-a/_trainjob/llama"
    # The Secret's keys, as the kubelet resolves the container's references.
    refs = {e["name"] for e in node["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert set(seaweedfs.aws_env()) <= refs
    for key, value in seaweedfs.aws_env().items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import S3Tier

    tier = S3Tier(uri, tmp_path / "staging")
    for step, reason in ((50, "periodic"), (137, "jit")):
        d = tier.begin(step)
        (d / "__0_0.distcp").write_bytes(b"r" * 64)
        tier.publish(step, ["__0_0.distcp"])
        m = build_manifest(
            d, step=step, epoch=0, world_size=2, framework="torch", tier=tier.name,
            extra={"reason": reason},
        )  # fmt: skip
        tier.commit(step, m)
    tier.begin(150)  # the resumed run's save in flight
    doc = json.loads(listing.render(listing.listing(uri, None)))
    status = training_status(150, total=300, resumedFrom="checkpoint-137")
    status["checkpointing"]["latestCheckpoint"] = tier.location(137)
    ck.add_reasons(doc, tp("llama", "team-a", kind="TrainJob", status=status))
    rows = ck.checkpoint_rows(doc)
    assert [r[:5] for r in rows] == [
        ["persistent", "checkpoint-150", "150", "writing", "-"],
        ["persistent", "checkpoint-137", "137", "complete", "jit,resumed-from"],
        ["persistent", "checkpoint-50", "50", "complete", "periodic"],
    ]
    assert [r[7:] for r in rows[1:]] == [["64 B", "1"], ["64 B", "1"]]
    assert doc["checkpoints"][1]["location"] == f"{uri}/checkpoint-137"
    # Its sentinel's heartbeat (one PUT a second) is live: being written, nothing to note.
    assert ck.checkpoint_notes(doc) == []
    # The writer dies mid-upload: its sentinel stays, no longer re-uploaded.
    tier._stop_beat(tier._key(150, INCOMPLETE_SENTINEL))
    doc = json.loads(listing.render(listing.listing(uri, None)))
    assert ck.checkpoint_rows(doc)[0][:4] == [
        "persistent", "checkpoint-150", "150", "incomplete"
    ]  # fmt: skip
    assert ck.checkpoint_notes(doc) == [
        "checkpoint-150 (persistent): sentinel left behind (no heartbeat in 2.5 s): the save "
        "did not finish"
    ]
    tier.discard(150)
