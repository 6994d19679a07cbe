"""`python -m trainer_runtime.listing` (what `kubeckpt checkpoints` runs in the rank-0 pod), on
checkpoints written by the runtime's own commit path (LocalTier: sentinel, files, manifest,
sentinel removed), then damaged the ways a crash, a full disk or a hostile volume leave them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer_runtime import listing
from trainer_runtime.contract import (
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    MANIFEST_GENERATION,
    MANIFEST_SEQUENCE,
    build_manifest,
)
from trainer_runtime.storage import LocalTier

REPO = Path(__file__).resolve().parents[3]


def save(
    tier: LocalTier,
    step: int,
    files: dict[str, bytes],
    *,
    sequence: int | None = None,
    generation: int | None = None,
) -> Path:
    """A checkpoint as the runtime commits it (in the tier's generation, with a sequence in
    commit order and its run's generation when given); returns its directory."""
    d = tier.begin(step)
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    extra: dict[str, int] = {}
    if sequence is not None:
        extra[MANIFEST_SEQUENCE] = sequence
    if generation is not None:
        extra[MANIFEST_GENERATION] = generation
    manifest = build_manifest(
        d, step=step, epoch=step // 10, world_size=2, framework="torch", tier=tier.name,
        extra=extra,
    )  # fmt: skip
    tier.commit(step, manifest)
    return d


def by_name(doc: dict, tier: str) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checkpoints"] if c["tier"] == tier}


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every path under `root`, symlinks not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def tiers(tmp_path: Path) -> Iterator[tuple[LocalTier, LocalTier]]:
    yield LocalTier(tmp_path / "persistent", "persistent"), LocalTier(tmp_path / "local", "local")


def test_complete_checkpoints_of_both_tiers_newest_first(tiers) -> None:
    persistent, local = tiers
    save(persistent, 10, {"model.pt": b"m" * 1000, "optim/0.pt": b"o" * 24})
    save(persistent, 20, {"model.pt": b"m" * 2000})
    save(local, 25, {"rank0.pt": b"r" * 300})
    doc = listing.listing(persistent.root, local.root)
    assert [(c["tier"], c["step"]) for c in doc["checkpoints"]] == [
        ("local", 25),
        ("persistent", 20),
        ("persistent", 10),
    ]
    ten = by_name(doc, "persistent")["checkpoint-10"]
    assert ten["complete"] is True and ten["state"] == "complete"
    assert ten["bytes"] == 1024 and ten["files"] == 2
    assert ten["epoch"] == 1 and ten["worldSize"] == 2 and ten["framework"] == "torch"
    assert ten["location"] == str(Path(persistent.root, "checkpoint-10"))
    assert ten["problems"] == []
    assert by_name(doc, "local")["checkpoint-25"]["bytes"] == 300
    assert doc["total"] == 3 and doc["truncated"] is False
    assert [t["error"] for t in doc["tiers"]] == [None, None]


def test_the_listing_changes_nothing(tiers) -> None:
    persistent, _ = tiers
    save(persistent, 1, {"a": b"x"})
    d = save(persistent, 2, {"a": b"y", "b": b"z"})
    (d / "b").write_bytes(b"zz")  # damaged: still only read
    Path(persistent.root, "checkpoint-3").mkdir()  # incomplete leftover: not removed
    before = snapshot(Path(persistent.root))
    listing.listing(persistent.root, None)
    assert snapshot(Path(persistent.root)) == before


def test_a_save_in_flight_reads_as_writing_then_complete(tiers) -> None:
    persistent, _ = tiers
    d = persistent.begin(30)  # the sentinel, with the writer's live heartbeat
    (d / "model.pt").write_bytes(b"w" * 10)
    c = by_name(listing.listing(persistent.root, None), "persistent")["checkpoint-30"]
    assert c["state"] == "writing" and c["complete"] is False
    assert c["bytes"] == 10 and c["files"] == 1  # walked: the sentinel is not counted
    # the same directory once its writer is gone (its heartbeat stopped)
    [beat] = [t for t in threading.enumerate() if t.name == "kubeckpt-heartbeat:checkpoint-30"]
    beat.stop()
    beat.join()
    c = by_name(listing.listing(persistent.root, None), "persistent")["checkpoint-30"]
    assert c["state"] == "incomplete"
    assert any("sentinel left behind" in p for p in c["problems"])
    manifest = build_manifest(d, step=30, epoch=0, world_size=1, framework="t", tier="persistent")
    persistent.commit(30, manifest)
    c = by_name(listing.listing(persistent.root, None), "persistent")["checkpoint-30"]
    assert c["state"] == "complete" and c["complete"] is True


@pytest.mark.parametrize("skew", [-120.0, 120.0])
def test_writing_is_told_by_the_heartbeat_not_by_the_storages_clock(tiers, skew: float) -> None:
    """Sentinels stamped 2 minutes off the listing's clock (an NFS server's): the one whose
    writer beats reads as writing, the one nobody touches as incomplete."""
    persistent, _ = tiers
    root = Path(persistent.root)
    for step in (1, 2):
        (root / f"checkpoint-{step}").mkdir(parents=True)
        (root / f"checkpoint-{step}" / INCOMPLETE_SENTINEL).write_text("")
    live = root / "checkpoint-1" / INCOMPLETE_SENTINEL
    t = time.time() + skew
    os.utime(root / "checkpoint-2" / INCOMPLETE_SENTINEL, (t, t))
    done = threading.Event()

    def beat() -> None:
        while not done.wait(0.2):
            t = time.time() + skew
            os.utime(live, (t, t))

    writer = threading.Thread(target=beat)
    writer.start()
    try:
        cs = by_name(listing.listing(str(root), None, watch=1.0), "persistent")
    finally:
        done.set()
        writer.join()
    assert cs["checkpoint-1"]["state"] == "writing" and cs["checkpoint-1"]["problems"] == []
    assert cs["checkpoint-2"]["state"] == "incomplete"
    assert "sentinel left behind" in cs["checkpoint-2"]["problems"][0]


def test_generations_are_listed_newest_first_by_commit_order(tiers) -> None:
    """A job re-created with resume "false" wrote generation-1 beside the root's checkpoints:
    both are listed, the newer generation first, each by commit order (not by step)."""
    persistent, local = tiers
    for step, seq in ((3000, 1), (4000, 2), (5000, 3)):
        save(persistent, step, {"a": b"x"}, sequence=seq, generation=0)
    persistent.generation = 1
    save(persistent, 200, {"a": b"y"}, sequence=4, generation=1)
    save(persistent, 100, {"a": b"z"}, sequence=5, generation=1)  # committed after 200
    save(local, 150, {"a": b"l"}, sequence=6, generation=1)
    doc = listing.listing(persistent.root, local.root)
    got = [(c["tier"], c["generation"], c["step"], c["sequence"]) for c in doc["checkpoints"]]
    assert got == [
        ("local", 1, 150, 6),
        ("persistent", 1, 100, 5),
        ("persistent", 1, 200, 4),
        ("persistent", 0, 5000, 3),
        ("persistent", 0, 4000, 2),
        ("persistent", 0, 3000, 1),
    ]
    hundred = doc["checkpoints"][1]
    assert hundred["location"] == str(Path(persistent.root, "generation-1", "checkpoint-100"))
    assert hundred["state"] == "complete"


def test_crashed_corrupt_and_damaged_checkpoints(tiers) -> None:
    persistent, _ = tiers
    root = Path(persistent.root)
    # a crash before the manifest: data, no sentinel (removed by hand), no manifest
    save(persistent, 1, {"a": b"1"})
    (root / "checkpoint-1" / MANIFEST_FILE).unlink()
    # a manifest that is not JSON
    d2 = save(persistent, 2, {"a": b"2"})
    (d2 / MANIFEST_FILE).write_bytes(b"{not json")
    # a file missing, and a file of another size (a torn copy)
    d3 = save(persistent, 3, {"a": b"3", "b": b"33"})
    (d3 / "b").unlink()
    d4 = save(persistent, 4, {"a": b"4444"})
    (d4 / "a").write_bytes(b"4")
    # a manifest that points elsewhere through a symlink: not followed
    d5 = save(persistent, 5, {"a": b"5"})
    secret = root.parent / "secret.json"
    secret.write_text((d5 / MANIFEST_FILE).read_text())
    (d5 / MANIFEST_FILE).unlink()
    (d5 / MANIFEST_FILE).symlink_to(secret)
    cs = by_name(listing.listing(str(root), None), "persistent")
    assert cs["checkpoint-1"]["state"] == "incomplete"
    assert "no manifest" in cs["checkpoint-1"]["problems"][0]
    assert cs["checkpoint-1"]["bytes"] == 1
    assert cs["checkpoint-2"]["state"] == "invalid"
    assert "unreadable manifest" in cs["checkpoint-2"]["problems"][0]
    assert cs["checkpoint-3"]["state"] == "damaged"
    assert cs["checkpoint-3"]["problems"] == ["missing file: b"]
    assert cs["checkpoint-4"]["state"] == "damaged"
    assert "size mismatch: a" in cs["checkpoint-4"]["problems"][0]
    assert cs["checkpoint-5"]["state"] == "invalid"
    assert not any(c["complete"] for c in cs.values())


def test_hostile_names_are_ignored_or_escaped(tiers, tmp_path: Path) -> None:
    persistent, _ = tiers
    root = Path(persistent.root)
    evil = "\x1b]0;pwned\x07\n[bold]x"
    d = save(persistent, 7, {"model.pt": b"m", evil: b"e"})
    (d / evil).unlink()  # reported as missing, by its name
    elsewhere = tmp_path / "elsewhere"
    save(LocalTier(elsewhere, "persistent"), 99, {"a": b"a"})
    (root / "checkpoint-8").symlink_to(elsewhere / "checkpoint-99")  # not a checkpoint
    for name in ("checkpoint-0100", "checkpoint-9\x1b[2J", "checkpoint--1", "checkpoint-1e3"):
        (root / name).mkdir()
    os.mkdir(os.fsencode(root) + b"/checkpoint-\xff")  # not UTF-8
    doc = listing.listing(str(root), None)
    assert [c["name"] for c in doc["checkpoints"]] == ["checkpoint-7"]
    assert doc["checkpoints"][0]["state"] == "damaged"
    assert doc["checkpoints"][0]["problems"] == [f"missing file: {evil}"]
    text = listing.render(doc)
    assert text.isascii() and "\x1b" not in text and "\n" not in text
    assert json.loads(text) == doc  # escaped, not lost


def test_bounds_on_entries_and_bytes(tiers) -> None:
    persistent, _ = tiers
    for step in range(1, 8):
        save(persistent, step, {"a": b"x"})
    doc = listing.listing(persistent.root, None, max_entries=3)
    assert [c["step"] for c in doc["checkpoints"]] == [7, 6, 5]
    assert doc["truncated"] is True and doc["total"] == 7
    full = listing.listing(persistent.root, None)
    one = len(json.dumps(full["checkpoints"][0], separators=(",", ":")))
    limit = len(listing.render(full)) - 2 * one  # room for all but about two
    text = listing.render(full, max_bytes=limit)
    assert len(text) <= limit
    cut = json.loads(text)
    assert cut["truncated"] is True
    assert 3 <= len(cut["checkpoints"]) < 7
    assert [c["step"] for c in cut["checkpoints"]] == list(
        range(7, 7 - len(cut["checkpoints"]), -1)
    )


def test_missing_and_absent_tiers(tmp_path: Path) -> None:
    doc = listing.listing(str(tmp_path / "nothing-yet"), None)
    assert doc["checkpoints"] == []
    [summary] = doc["tiers"]
    assert (summary["tier"], summary["root"]) == ("persistent", str(tmp_path / "nothing-yet"))
    assert "does not exist" in summary["error"]
    assert listing.listing(None, None)["tiers"] == []
    file_uri = listing.listing(f"file://{tmp_path}", None)
    assert file_uri["tiers"][0]["root"] == str(tmp_path) and file_uri["tiers"][0]["error"] is None
    gcs = listing.listing("gs://bucket/x", None)
    assert gcs["tiers"][0]["error"] == "unsupported scheme"


def test_module_reads_the_injected_env_and_imports_only_the_standard_library(tiers) -> None:
    persistent, local = tiers
    save(persistent, 40, {"a": b"p" * 5})
    save(local, 45, {"a": b"l" * 6})
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['listing', '--max-entries', '5']\n"
        "try:\n"
        "    runpy.run_module('trainer_runtime.listing', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "third = sorted(m for m in ('torch', 'yaml', 'aiohttp', 'fsspec', 'numpy') "
        "if m in sys.modules)\n"
        "sys.stderr.write(repr(third))\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "CHECKPOINT_URI": persistent.root,
        "CHECKPOINT_LOCAL_DIR": local.root,
    }
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode() == "[]"
    doc = json.loads(proc.stdout)
    assert [(c["tier"], c["step"], c["bytes"]) for c in doc["checkpoints"]] == [
        ("local", 45, 6),
        ("persistent", 40, 5),
    ]


def test_bad_arguments_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        listing.main(["--max-bytes", "10"], environ={})
    assert e.value.code == 2
    assert listing.main([], environ={}) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"] == []


def test_s3_tier(s3_root, tmp_path: Path) -> None:
    from trainer_runtime.storage import S3Tier

    fs, uri = s3_root
    tier = S3Tier(uri, tmp_path / "staging", fs=fs)
    for step in (5, 6):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"s" * 50)
        tier.publish(step, ["model.pt"])
        if step == 5:
            m = build_manifest(
                d, step=step, epoch=0, world_size=1, framework="t", tier=tier.name,
                extra={"reason": "jit"},
            )  # fmt: skip
            tier.commit(step, m)
    doc = listing.listing(uri, None)
    cs = by_name(doc, "persistent")
    assert cs["checkpoint-5"]["state"] == "complete" and cs["checkpoint-5"]["bytes"] == 50
    assert cs["checkpoint-5"]["reason"] == "jit"  # from the manifest, as in a directory tier
    assert cs["checkpoint-5"]["location"] == f"{uri}/checkpoint-5"
    # Its upload's heartbeat re-uploads the sentinel every second: being written.
    assert cs["checkpoint-6"]["state"] == "writing" and cs["checkpoint-6"]["files"] == 1
    assert cs["checkpoint-6"]["problems"] == []
    # Its writer gone (the heartbeat stopped, the sentinel left): incomplete, and said why.
    tier._stop_beat(tier._key(6, INCOMPLETE_SENTINEL))
    cs = by_name(listing.listing(uri, None), "persistent")
    assert cs["checkpoint-6"]["state"] == "incomplete"
    assert cs["checkpoint-6"]["problems"][0].startswith("sentinel left behind")
    assert INCOMPLETE_SENTINEL not in json.dumps(cs["checkpoint-6"]["problems"])
    tier.discard(6)
    missing = listing.listing("s3://listing-test/none", None)
    assert missing["checkpoints"] == [] and missing["tiers"][0]["error"]


def test_s3_without_s3fs_names_the_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsspec without s3fs (and neither, tests/unit/cli): the tier's `missing` says so, apart
    from a bucket's or the credentials' errors, which do not set it."""
    import fsspec  # noqa: F401 - installed here: only s3fs is made to be missing

    monkeypatch.setitem(sys.modules, "s3fs", None)  # `import s3fs` raises ImportError
    # The s3 class an earlier test loaded, forgotten: fsspec imports s3fs again
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    doc = listing.listing("s3://bucket/runs/team-a/j", None)
    (tier,) = doc["tiers"]
    assert tier["missing"] == "fsspec/s3fs" and tier["error"].startswith("cannot list: ")
    assert "pip install 'kubeckpt[s3]'" in tier["error"]
    assert doc["checkpoints"] == []
    monkeypatch.undo()
    # With s3fs, a bucket that cannot be reached is the storage's error: no `missing`
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    unreachable = listing.listing("s3://bucket/runs", None)
    assert unreachable["tiers"][0]["error"] and "missing" not in unreachable["tiers"][0]
