"""s3:// with ranks on several nodes (a TrainJob's or a multi-node PyTorchJob's pods: one rank
each, every one local rank 0): the bucket is one checkpoint for all of them, so global rank 0
alone begins and commits it, and its manifest lists every rank's files.

Found on the real node: a two-pod TrainJob's JIT checkpoint on SeaweedFS had a manifest naming
only one rank's shards (the other's, last session), because each pod's local rank 0 took itself
for the coordinator of a per-node tier and wrote a manifest of its own node's files over the
other's; each pod's `begin` could also delete what the other had uploaded. The toy ranks
(tests/support/toy_ranks.py) stand for the pods: one node each, their own staging directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.simulated_ranks import run_ranks
from tests.support.toy_ranks import Job, ToyLoader, ToySave
from trainer_runtime.contract import MANIFEST_FILE, checkpoint_dir_name


def _train(job: Job, rank: int, steps: range) -> None:
    ckpt = job.stops[rank].ckpt
    for step in steps:
        d = job.stops[rank].decide(step)
        if d.persistent:
            ckpt.save(step, lambda s=step: ToySave(rank, [s, rank]), persistent=True)
    ckpt.session.wait()


def test_ranks_on_two_nodes_commit_one_manifest_that_lists_both(
    s3_root: tuple[object, str], tmp_path: Path
) -> None:
    fs, uri = s3_root
    job = Job(tmp_path, 2, CHECKPOINT_URI=uri)
    try:
        run_ranks(2, lambda r: _train(job, r, range(1, 7)))
    finally:
        job.close()
    root = uri.removeprefix("s3://")
    fs.invalidate_cache()  # type: ignore[attr-defined]
    for step in (4, 6):  # retention keeps 2
        prefix = f"{root}/{checkpoint_dir_name(step)}"
        manifest = json.loads(fs.cat_file(f"{prefix}/{MANIFEST_FILE}"))  # type: ignore[attr-defined]
        assert sorted(f["path"] for f in manifest["files"]) == ["rank-0.json", "rank-1.json"]
        assert manifest["worldSize"] == 2, manifest
        names = {k.removeprefix(prefix + "/") for k in fs.find(prefix)}  # type: ignore[attr-defined]
        assert names == {"rank-0.json", "rank-1.json", MANIFEST_FILE}, names

    # A new job on two nodes restores that step on each, each rank its own state.
    (tmp_path / "again").mkdir()
    again = Job(tmp_path / "again", 2, CHECKPOINT_URI=uri)
    loaders = [ToyLoader(r) for r in range(2)]
    try:
        steps = run_ranks(2, lambda r: again.ckpts[r].restore(loaders[r]).step)
    finally:
        again.close()
    assert steps == [6, 6] and [ld.loaded for ld in loaders] == [[6, 0], [6, 1]]
