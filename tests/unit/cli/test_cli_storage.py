"""`kubeckpt checkpoints JOB --storage PATH`: a job's checkpoints read from a local path (a
mounted PVC, a copy), no cluster, laid out as the webhook lays out a job's directory and written
by the runtime's own commit path; and the same listing, byte for byte, as the pods run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB, TRAINJOB
from kubeckpt_cli import local_storage
from kubeckpt_cli.errors import EXIT_NOT_FOUND, EXIT_USAGE, EXIT_VERIFY_FAILED, CliError
from tests.support.cli_objects import REPO, run_cli
from trainer_runtime.contract import build_manifest
from trainer_runtime.fsutil import remove_tree
from trainer_runtime.storage import LocalTier

# No cluster at all: no kubeconfig, not a pod.
NO_CLUSTER = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}


def save(tier: LocalTier, step: int, size: int, reason: str | None = None) -> Path:
    d = tier.begin(step)
    (d / "model.pt").write_bytes(b"m" * size)
    extra = {"reason": reason} if reason else {}
    m = build_manifest(
        d, step=step, epoch=0, world_size=1, framework="torch", tier="persistent", extra=extra
    )
    tier.commit(step, m)
    return d


def job_dir(root: Path, namespace: str, job: str, kind=PYTORCHJOB) -> Path:
    """A job's checkpoints as a finished job leaves them below the policy's root: two complete
    ones (one with a reason), one damaged, one never finished, and a name that is no checkpoint."""
    d = root / kind.storage_dir(namespace, job)
    tier = LocalTier(d, "persistent")
    save(tier, 10, 4096, "periodic")
    save(tier, 20, 2048, "jit")
    torn = save(tier, 25, 1024)
    (torn / "model.pt").write_bytes(b"m")
    (d / "checkpoint-30").mkdir()
    (d / "checkpoint-9\x1b[2J").mkdir()
    return d


def test_the_policy_root_or_the_jobs_own_directory(tmp_path: Path) -> None:
    ns = "team-a"
    d = job_dir(tmp_path, ns, "llama")
    assert local_storage.job_root(str(tmp_path), ns, "llama", JOB_KINDS) == d
    assert local_storage.job_root(str(d), ns, "llama", JOB_KINDS) == d
    # A TrainJob's directory is its kind's (`<ns>/_trainjob/<name>`)
    t = job_dir(tmp_path, ns, "bert", TRAINJOB)
    assert t == tmp_path / ns / "_trainjob" / "bert"
    assert local_storage.job_root(str(tmp_path), ns, "bert", JOB_KINDS) == t
    # An empty job directory (nothing saved yet) is the job's when named after it
    (tmp_path / "empty" / "gpt").mkdir(parents=True)
    got = local_storage.job_root(str(tmp_path / "empty" / "gpt"), ns, "gpt", JOB_KINDS)
    assert got == tmp_path / "empty" / "gpt"


def test_unclear_or_missing_storage_says_what_to_give(tmp_path: Path) -> None:
    ns = "team-a"
    job_dir(tmp_path, ns, "llama")
    job_dir(tmp_path, ns, "llama", TRAINJOB)
    with pytest.raises(CliError) as e:
        local_storage.job_root(str(tmp_path), ns, "llama", JOB_KINDS)
    assert e.value.code == EXIT_USAGE and "choose one with --kind" in e.value.message
    only = local_storage.job_root(str(tmp_path), ns, "llama", [TRAINJOB])
    assert only == tmp_path / ns / "_trainjob" / "llama"

    with pytest.raises(CliError) as e:
        local_storage.job_root(str(tmp_path), "other-ns", "llama", JOB_KINDS)
    assert e.value.code == EXIT_NOT_FOUND
    assert "other-ns/_trainjob/llama or other-ns/llama" in e.value.message
    assert "check -n and --kind" in e.value.message

    with pytest.raises(CliError) as e:
        local_storage.job_root(str(tmp_path / "nope"), ns, "llama", JOB_KINDS)
    assert e.value.code == EXIT_NOT_FOUND and "not a directory" in e.value.message

    # Checkpoints at the root and the job's directory below it: which one is meant?
    save(LocalTier(tmp_path, "persistent"), 5, 10)
    with pytest.raises(CliError) as e:
        local_storage.job_root(str(tmp_path), ns, "llama", [PYTORCHJOB])
    assert "ambiguous" in e.value.message


def test_storage_lists_through_the_cli_without_a_cluster(tmp_path: Path) -> None:
    root = tmp_path / "mnt" / "ckpt" / "runs"  # the policy's pvc://ckpt/runs, mounted here
    d = job_dir(root, "team-a", "llama")
    proc = run_cli("checkpoints", "llama", "-n", "team-a", "--storage", str(root), env=NO_CLUSTER)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == "TIER CHECKPOINT STEP STATE REASON SAVED AGE SIZE FILES".split()
    rows = [ln.split() for ln in lines[1:5]]
    assert [r[:5] for r in rows] == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["persistent", "checkpoint-25", "25", "damaged", "-"],
        ["persistent", "checkpoint-20", "20", "complete", "jit"],
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    assert rows[2][-3:] == ["2.0", "KiB", "1"]
    assert "checkpoint-30 (persistent): no manifest: the save did not finish" in lines
    assert any(ln.startswith("checkpoint-25 (persistent): size mismatch: model.pt") for ln in lines)
    assert "\x1b" not in proc.stdout

    # -o json: the listing's document, and where it was read
    proc = run_cli(
        "checkpoints", "llama", "-n", "team-a", "--storage", str(d), "-o", "json", env=NO_CLUSTER
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["storage"] == str(d) and doc["job"] == "llama" and doc["namespace"] == "team-a"
    assert [(c["step"], c["state"], c["bytes"]) for c in doc["checkpoints"]] == [
        (30, "incomplete", 0),
        (25, "damaged", 1024),
        (20, "complete", 2048),
        (10, "complete", 4096),
    ]


def test_storage_errors_are_one_line(tmp_path: Path) -> None:
    job_dir(tmp_path, "team-a", "llama")
    proc = run_cli(
        "checkpoints", "llama", "-n", "other", "--storage", str(tmp_path), env=NO_CLUSTER
    )
    assert proc.returncode == EXIT_NOT_FOUND
    assert proc.stderr.startswith(f'kubeckpt: --storage {tmp_path}: no checkpoints of "llama"')
    assert proc.stderr.count("\n") == 1
    proc = run_cli("checkpoints", "j", "--storage", str(tmp_path), "--image", "x", env=NO_CLUSTER)
    assert proc.returncode == EXIT_USAGE and "--policy and --image are for a lister pod" in (
        proc.stderr
    )


def test_storage_reads_the_same_listing_the_pods_run(tmp_path: Path) -> None:
    """One listing for the three ways: what `python -m trainer_runtime.listing` prints in a pod
    (the rank-0 pod's exec, the lister pod's log) is what `--storage` shows, but for its time."""
    d = job_dir(tmp_path, "team-a", "llama")
    ran = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.listing", "--persistent", str(d)],
        capture_output=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    in_pod = json.loads(ran.stdout)
    here = local_storage.list_local(d, max_entries=200, max_bytes=256 * 1024)
    assert in_pod.pop("time") and here.pop("time")
    assert here == in_pod


# --- checkpoints --verify (issue 27 item 4) -------------------------------------------------------


def test_verify_on_local_storage_names_the_flipped_byte_and_fails(tmp_path: Path) -> None:
    """One good checkpoint and one with a byte flipped (same size: only the content hash tells,
    which a plain listing never computes): --verify says OK / why per checkpoint, exit 4."""
    d = tmp_path / PYTORCHJOB.storage_dir("team-a", "llama")
    tier = LocalTier(d, "persistent")
    save(tier, 10, 4096, "periodic")
    bad = save(tier, 20, 2048, "jit")
    data = bytearray((bad / "model.pt").read_bytes())
    data[100] ^= 0x01
    (bad / "model.pt").write_bytes(bytes(data))

    listed = ("checkpoints", "llama", "-n", "team-a", "--storage", str(tmp_path))
    plain = run_cli(*listed, env=NO_CLUSTER)
    assert plain.returncode == 0 and "damaged" not in plain.stdout  # sizes alone cannot tell

    args = (*listed, "--verify")
    proc = run_cli(*args, env=NO_CLUSTER)
    assert proc.returncode == EXIT_VERIFY_FAILED, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == "TIER CHECKPOINT STEP VERIFIED WHY".split()
    assert lines[1].split()[:5] == [
        "persistent", "checkpoint-20", "20", "FAILED", "checksum",
    ]  # fmt: skip
    assert "checksum mismatch: model.pt: expected" in lines[1]
    assert lines[2].split() == ["persistent", "checkpoint-10", "10", "OK", "-"]

    doc = json.loads(run_cli(*args, "-o", "json", env=NO_CLUSTER).stdout)
    assert [(c["step"], c["verified"], c["state"]) for c in doc["checkpoints"]] == [
        (20, False, "damaged"),
        (10, True, "complete"),
    ]

    # The good one alone: exit 0.
    remove_tree(bad)
    proc = run_cli(*args, env=NO_CLUSTER)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[1].split() == ["persistent", "checkpoint-10", "10", "OK", "-"]


def test_verify_names_a_newer_format_version_and_leaves_unfinished_ones_unchecked(
    tmp_path: Path,
) -> None:
    d = job_dir(tmp_path, "team-a", "llama")  # 10, 20 complete; 25 damaged; 30 unfinished
    manifest = d / "checkpoint-20" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"formatVersion": 1', '"formatVersion": 3'))
    doc = local_storage.list_local(d, max_entries=200, max_bytes=256 * 1024, verify=True)
    got = {c["step"]: (c["state"], c.get("verified")) for c in doc["checkpoints"]}
    assert got[10] == ("complete", True) and got[25] == ("damaged", False)
    assert got[20] == ("invalid", False) and got[30] == ("incomplete", None)
    [twenty] = [c for c in doc["checkpoints"] if c["step"] == 20]
    assert "unsupported version 3" in twenty["problems"][0]
    assert "upgrade the runtime image" in twenty["problems"][0]
    # Without --verify the listing is what it was: no `verified` key.
    plain = local_storage.list_local(d, max_entries=200, max_bytes=256 * 1024)
    assert all("verified" not in c for c in plain["checkpoints"])
