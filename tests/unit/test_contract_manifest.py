"""Checkpoint manifest contract: build, verify, JSON validation, atomic write, completeness."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from trainer_runtime.contract import (
    CHECKSUM_ALGORITHMS,
    HASH_CHUNK_BYTES,
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    SHA256,
    XXH3_128,
    ContractError,
    Manifest,
    ManifestFile,
    UnsupportedFormatVersion,
    build_manifest,
    checksum_available,
    format_checksum,
    hash_file,
    is_complete,
    new_hasher,
    parse_checksum,
    preferred_checksum,
    read_manifest,
    verify,
    write_manifest_atomic,
)
from trainer_runtime.contract import manifest as manifest_module
from trainer_runtime.contract.manifest import MMAP_MIN_BYTES

BIG = HASH_CHUNK_BYTES * 2 + 12345  # spans several hash chunks, ends mid-chunk


def make_checkpoint(root: Path) -> dict[str, bytes]:
    contents = {
        "model.safetensors": bytes(range(256)) * (BIG // 256) + b"tail",
        "optimizer.pt": b"opt" * 1000,
        "empty.bin": b"",
        "rng_state_0.pth": b"rng0",
        "__0_0.distcp": b"shard-0",
        "sub/dir/config.json": b'{"a": 1}',
        "sub/trainer_state.json": b"{}",
    }
    for rel, data in contents.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    # Never part of the content.
    (root / INCOMPLETE_SENTINEL).write_text("writing")
    (root / MANIFEST_FILE).write_text("{stale}")
    (root / f".{MANIFEST_FILE}.abc123.tmp").write_text("crashed write")
    return contents


def build(root: Path, **kwargs: Any) -> Manifest:
    args: dict[str, Any] = {
        "step": 150,
        "epoch": 2,
        "world_size": 4,
        "framework": "torch-dcp",
        "tier": "persistent",
    }
    return build_manifest(root, **(args | kwargs))


def test_build_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    contents = make_checkpoint(tmp_path)
    m = build(tmp_path, time="2024-01-15T10:25:00Z")
    assert [f.path for f in m.files] == sorted(contents)
    for entry in m.files:
        data = contents[entry.path]
        assert entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert m.total_size == sum(len(d) for d in contents.values())
    assert (m.step, m.epoch, m.world_size, m.framework, m.tier) == (
        150,
        2,
        4,
        "torch-dcp",
        "persistent",
    )
    assert m.format_version == 1 and m.time == "2024-01-15T10:25:00Z"
    assert verify(tmp_path, m) == []


def test_build_defaults_time_to_now_in_rfc3339(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    m = build(tmp_path)
    assert m.time.endswith("Z") and len(m.time) == len("2024-01-15T10:25:00Z")


def test_build_exclude_patterns(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path, exclude=("sub/*", "*.pth"))
    paths = {f.path for f in m.files}
    assert paths == {"model.safetensors", "optimizer.pt", "empty.bin", "__0_0.distcp"}


def test_build_refuses_symlinks(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ContractError, match="link: not a regular file"):
        build(tmp_path)


def test_build_refuses_symlinked_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "dir").symlink_to(outside)
    with pytest.raises(ContractError, match="dir: not a regular file"):
        build(ckpt)


def test_build_validates_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"^tier:"):
        build(tmp_path, tier="remote")
    with pytest.raises(ContractError, match=r"^worldSize:"):
        build(tmp_path, world_size=0)
    with pytest.raises(ContractError, match=r"^step:"):
        build(tmp_path, step=-1)
    with pytest.raises(FileNotFoundError):
        build(tmp_path / "missing")


# --- verify ---


def test_verify_detects_a_flipped_byte(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    path = tmp_path / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[HASH_CHUNK_BYTES + 7] ^= 0x01  # in the second chunk
    path.write_bytes(data)
    problems = verify(tmp_path, m)
    assert len(problems) == 1
    assert problems[0].startswith("checksum mismatch: model.safetensors")
    # Without checksums only sizes are compared, and the size is unchanged.
    assert verify(tmp_path, m, checksums=False) == []


def test_verify_detects_a_truncated_file(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    path = tmp_path / "sub" / "dir" / "config.json"
    path.write_bytes(path.read_bytes()[:-1])
    for checksums in (True, False):
        problems = verify(tmp_path, m, checksums=checksums)
        assert problems == ["size mismatch: sub/dir/config.json: expected 8 bytes, found 7"]


def test_verify_detects_a_missing_file(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    (tmp_path / "optimizer.pt").unlink()
    (tmp_path / "empty.bin").unlink()
    assert sorted(verify(tmp_path, m)) == ["missing file: empty.bin", "missing file: optimizer.pt"]


def test_verify_reports_every_problem_at_once(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    (tmp_path / "optimizer.pt").unlink()
    (tmp_path / "rng_state_0.pth").write_bytes(b"rngX")  # same size, other content
    (tmp_path / "__0_0.distcp").write_bytes(b"longer shard")
    problems = verify(tmp_path, m)
    assert len(problems) == 3
    assert {p.split(":")[0] for p in problems} == {
        "missing file",
        "checksum mismatch",
        "size mismatch",
    }


def test_verify_rejects_a_file_replaced_by_a_symlink(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    copy = tmp_path.parent / f"{tmp_path.name}-copy-of-rng"
    copy.write_bytes(b"rng0")
    (tmp_path / "rng_state_0.pth").unlink()
    (tmp_path / "rng_state_0.pth").symlink_to(copy)
    assert verify(tmp_path, m) == ["not a regular file: rng_state_0.pth"]


def test_verify_does_not_follow_a_symlinked_parent_outside(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "f").write_bytes(b"data")
    m = build(ckpt)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"data")  # identical content, but not in the checkpoint
    (ckpt / "sub" / "f").unlink()
    (ckpt / "sub").rmdir()
    (ckpt / "sub").symlink_to(outside)
    assert verify(ckpt, m) == ["outside the checkpoint directory: sub/f"]


def test_extra_files_on_disk_do_not_fail_verify(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path)
    (tmp_path / "unlisted.log").write_text("x")
    assert verify(tmp_path, m) == []


# --- JSON ---


def sample() -> Manifest:
    return Manifest(
        step=150,
        epoch=2,
        time="2024-01-15T10:25:00Z",
        world_size=4,
        framework="hf",
        tier="local",
        files=[
            ManifestFile(path="a/b.bin", size=3, sha256="a" * 64),
            ManifestFile(path="c.json", size=0, sha256=hashlib.sha256(b"").hexdigest()),
        ],
    )


def sample_dict() -> dict[str, Any]:
    return json.loads(sample().to_json())


def test_json_round_trip_keeps_extras_at_both_levels() -> None:
    data = sample_dict()
    assert data["formatVersion"] == 1 and data["worldSize"] == 4
    assert data["files"][0] == {"path": "a/b.bin", "size": 3, "sha256": "a" * 64}
    data["savedBy"] = {"host": "node-1", "rank": 0}
    data["files"][1]["shardRank"] = 3
    m = Manifest.from_json(json.dumps(data))
    assert m.extra == {"savedBy": {"host": "node-1", "rank": 0}}
    assert m.files[1].extra == {"shardRank": 3}
    assert json.loads(m.to_json()) == data
    assert Manifest.from_json(m.to_json().encode()) == m


@pytest.mark.parametrize(
    "path",
    [
        "../x",
        "/etc/passwd",
        "a/../../x",
        "a/..",
        "..",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "",
        "a\\..\\b",
        "a\x00b",
        MANIFEST_FILE,
        INCOMPLETE_SENTINEL,
    ],
)
def test_from_json_rejects_unsafe_paths(path: str) -> None:
    data = sample_dict()
    data["files"][1]["path"] = path
    with pytest.raises(ContractError) as exc:
        Manifest.from_json(json.dumps(data))
    assert str(exc.value).startswith("files[1].path:")
    assert exc.value.field == "files[1].path"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("formatVersion", 3, "formatVersion: unsupported version 3"),
        ("formatVersion", "1", "formatVersion: expected integer, got string"),
        ("step", "150", "step: expected integer, got string"),
        ("step", True, "step: expected integer, got boolean"),
        ("step", -1, "step: must be between 0"),
        ("epoch", 1.5, "epoch: expected integer, got number"),
        ("time", "2024-01-15", "time: expected an RFC 3339 timestamp"),
        ("time", 1705314300, "time: expected an RFC 3339 timestamp"),
        ("worldSize", 0, "worldSize: must be between 1"),
        ("framework", "", "framework: expected a short name"),
        ("framework", 3, "framework: expected string, got integer"),
        ("tier", "remote", "tier: must be one of local, persistent"),
        ("files", {}, "files: expected array, got object"),
        ("files.0", "a/b.bin", "files[0]: expected object, got string"),
        ("files.0.size", "3", "files[0].size: expected integer, got string"),
        ("files.0.size", False, "files[0].size: expected integer, got boolean"),
        ("files.0.size", -3, "files[0].size: must be between 0"),
        ("files.0.sha256", "A" * 64, "files[0].sha256: expected 64 lowercase hex digits"),
        ("files.0.sha256", "a" * 63, "files[0].sha256: expected 64 lowercase hex digits"),
        ("files.0.sha256", None, "files[0].sha256: expected string, got null"),
        ("files.1.path", "a/b.bin", "files[1].path: duplicate path"),
    ],
)
def test_from_json_errors_name_the_field(path: str, value: Any, expected: str) -> None:
    data = sample_dict()
    *parents, last = path.split(".")
    target: Any = data
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    with pytest.raises(ContractError) as exc:
        Manifest.from_json(json.dumps(data))
    assert str(exc.value).startswith(expected)


@pytest.mark.parametrize("missing", ["formatVersion", "step", "epoch", "time", "worldSize", "tier"])
def test_from_json_requires_fields(missing: str) -> None:
    data = sample_dict()
    del data[missing]
    with pytest.raises(ContractError, match=f"^{missing}: required field is missing"):
        Manifest.from_json(json.dumps(data))


def test_from_json_requires_file_fields() -> None:
    data = sample_dict()
    del data["files"][1]["sha256"]
    with pytest.raises(ContractError, match=r"^files\[1\]\.sha256: required field is missing"):
        Manifest.from_json(json.dumps(data))


@pytest.mark.parametrize("raw", ["", "{", "[]", "null", '{"step": NaN}', b"\xff"])
def test_from_json_rejects_non_manifests(raw: str | bytes) -> None:
    with pytest.raises(ContractError, match="manifest"):
        Manifest.from_json(raw)


def test_constructing_a_bad_file_entry_fails() -> None:
    with pytest.raises(ContractError, match="path"):
        ManifestFile(path="../escape", size=1, sha256="a" * 64)
    with pytest.raises(ContractError, match="duplicate"):
        Manifest(
            step=1,
            epoch=0,
            time="2024-01-15T10:25:00Z",
            world_size=1,
            framework="jax",
            tier="local",
            files=[ManifestFile("a", 1, "a" * 64), ManifestFile("a", 1, "a" * 64)],
        )


# --- atomic write, read, completeness ---


def test_write_manifest_atomic_then_read(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    (tmp_path / f".{MANIFEST_FILE}.abc123.tmp").unlink()
    m = build(tmp_path)
    target = write_manifest_atomic(tmp_path, m)
    assert target == tmp_path / MANIFEST_FILE
    assert read_manifest(tmp_path) == m
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    # Rebuilding after the manifest exists gives the same listing: it never lists itself.
    assert build(tmp_path, time=m.time).files == m.files


def test_write_manifest_atomic_leaves_no_temp_file_on_failure(tmp_path: Path) -> None:
    m = sample()
    (tmp_path / MANIFEST_FILE).mkdir()  # rename over a directory fails
    with pytest.raises(OSError):
        write_manifest_atomic(tmp_path, m)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]


def test_is_complete_needs_manifest_and_no_sentinel(tmp_path: Path) -> None:
    (tmp_path / "weights").write_bytes(b"w")
    (tmp_path / INCOMPLETE_SENTINEL).write_text("")
    assert not is_complete(tmp_path)
    write_manifest_atomic(tmp_path, build(tmp_path))
    assert not is_complete(tmp_path)  # sentinel still there
    (tmp_path / INCOMPLETE_SENTINEL).unlink()
    assert is_complete(tmp_path)
    (tmp_path / MANIFEST_FILE).unlink()
    assert not is_complete(tmp_path)


def test_read_manifest_rejects_a_corrupt_file(tmp_path: Path) -> None:
    data = sample_dict()
    data["files"][0]["size"] = "3"
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(ContractError, match=r"^files\[0\]\.size: expected integer"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_bytes(b"\x00" * 10)
    with pytest.raises(ContractError, match="not valid JSON"):
        read_manifest(tmp_path)


# --- checksums other than SHA-256 (issue 17) ------------------------------------------------


def test_xxh3_manifest_round_trips_and_verifies(tmp_path: Path) -> None:
    import xxhash

    contents = make_checkpoint(tmp_path)
    m = build(tmp_path, time="2024-01-15T10:25:00Z", checksum=XXH3_128)
    for entry in m.files:
        assert entry.sha256 is None
        assert entry.xxh3_128 == xxhash.xxh3_128(contents[entry.path]).hexdigest()
        assert entry.checksum == (XXH3_128, entry.xxh3_128)
    data = json.loads(m.to_json())
    first = data["files"][0]
    assert set(first) == {"path", "size", "xxh3_128"} and len(first["xxh3_128"]) == 32
    again = Manifest.from_json(m.to_json())
    assert again == m and verify(tmp_path, again) == []


@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])  # first byte, middle, last byte
def test_xxh3_verify_detects_a_flipped_byte_anywhere(tmp_path: Path, where: float) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path, checksum=XXH3_128)
    path = tmp_path / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[min(int(where * len(data)), len(data) - 1)] ^= 0x80
    path.write_bytes(bytes(data))
    problems = verify(tmp_path, m)
    assert len(problems) == 1 and problems[0].startswith(
        "checksum mismatch: model.safetensors: expected xxh3_128 "
    )
    assert verify(tmp_path, m, checksums=False) == []  # same size: only the content tells


def test_sha256_manifests_still_verify_and_mixed_entries_work(tmp_path: Path) -> None:
    contents = make_checkpoint(tmp_path)
    old = build(tmp_path)  # what every manifest before issue 17 holds
    assert all(f.sha256 and f.xxh3_128 is None for f in old.files)
    assert verify(tmp_path, Manifest.from_json(old.to_json())) == []
    # A file may carry both; verification takes the faster one, and either must match.
    data = contents["optimizer.pt"]
    both = ManifestFile(
        "optimizer.pt",
        len(data),
        hashlib.sha256(data).hexdigest(),
        xxh3_128="0" * 32,
    )
    assert both.checksum == (XXH3_128, "0" * 32)
    m = Manifest(
        step=1,
        epoch=0,
        time="2024-01-15T10:25:00Z",
        world_size=1,
        framework="f",
        tier="local",
        files=[both],
    )
    assert verify(tmp_path, m)[0].startswith("checksum mismatch: optimizer.pt: expected xxh3_128")


def test_writer_checksum_strings() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert format_checksum(SHA256, digest) == digest  # what writers always reported
    assert parse_checksum(digest) == (SHA256, digest)
    tagged = format_checksum(XXH3_128, "a" * 32)
    assert tagged == "xxh3_128:" + "a" * 32 and parse_checksum(tagged) == (XXH3_128, "a" * 32)
    # A writer's string (the protocol's reports) lands in its own field, through from_checksum
    # or passed as `sha256=`.
    entry = ManifestFile(path="a", size=1, sha256=tagged)
    assert (entry.sha256, entry.xxh3_128) == (None, "a" * 32)
    assert entry.to_dict() == {"path": "a", "size": 1, "xxh3_128": "a" * 32}
    assert ManifestFile.from_checksum("a", 1, tagged) == entry
    assert ManifestFile.from_checksum("a", 1, digest).to_dict() == {
        "path": "a",
        "size": 1,
        "sha256": digest,
    }
    for bad in ("md5:" + "a" * 32, "xxh3_128:" + "a" * 31, "xxh3_128:" + "A" * 32, "a" * 63):
        with pytest.raises(ContractError):
            parse_checksum(bad)
        with pytest.raises(ContractError):
            ManifestFile.from_checksum("a", 1, bad)
    with pytest.raises(ContractError, match="expected 32 lowercase hex digits"):
        ManifestFile(path="a", size=1, xxh3_128="a" * 64)
    with pytest.raises(ContractError, match=r"file\.sha256: required field is missing"):
        ManifestFile(path="a", size=1)


def test_from_dict_checks_every_checksum_given() -> None:
    entry = {"path": "a", "size": 1, "xxh3_128": "b" * 32}
    assert ManifestFile.from_dict(entry).checksum == (XXH3_128, "b" * 32)
    with pytest.raises(ContractError, match=r"^files\[0\]\.xxh3_128: expected string, got null"):
        ManifestFile.from_dict({**entry, "xxh3_128": None}, "files[0]")
    with pytest.raises(ContractError, match=r"^f\.sha256: expected 64 lowercase hex digits"):
        ManifestFile.from_dict({**entry, "sha256": "c" * 32}, "f")


def test_a_checksum_this_process_cannot_compute_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_checkpoint(tmp_path)
    m = build(tmp_path, checksum=XXH3_128)
    monkeypatch.setattr(manifest_module, "_xxhash", lambda: None)  # xxhash not installed
    assert not checksum_available(XXH3_128) and preferred_checksum() == SHA256
    problems = verify(tmp_path, m)
    assert len(problems) == len(m.files)
    assert all(p.startswith("cannot check xxh3_128: ") for p in problems)
    assert verify(tmp_path, m, checksums=False) == []
    with pytest.raises(ContractError, match="xxhash"):
        new_hasher(XXH3_128)


@pytest.mark.parametrize("size", [HASH_CHUNK_BYTES + 7, MMAP_MIN_BYTES + 7])  # read / mapped
def test_hash_file_with_each_algorithm(tmp_path: Path, size: int) -> None:
    import xxhash

    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert hash_file(tmp_path / "f") == (len(data), hashlib.sha256(data).hexdigest())
    assert hash_file(tmp_path / "f", XXH3_128) == (len(data), xxhash.xxh3_128(data).hexdigest())
    assert set(CHECKSUM_ALGORITHMS) == {SHA256, XXH3_128}


# --- formatVersion 2 (issue 27 item 5) ----------------------------------------------------------


def test_writers_stamp_version_2_only_with_xxh3(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    assert build(tmp_path, checksum=XXH3_128).format_version == 2
    assert json.loads(build(tmp_path, checksum=XXH3_128).to_json())["formatVersion"] == 2
    assert build(tmp_path).format_version == 1  # sha256 only: every runtime image reads it


def test_version_1_and_2_manifests_read_and_verify(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    v1 = json.loads(build(tmp_path).to_json())
    v2 = json.loads(build(tmp_path, checksum=XXH3_128).to_json())
    assert (v1["formatVersion"], v2["formatVersion"]) == (1, 2)
    # A version 1 manifest that already carries xxh3_128 (written before version 2 existed).
    v1_xxh3 = {**v2, "formatVersion": 1}
    for data, version in ((v1, 1), (v2, 2), (v1_xxh3, 1)):
        m = Manifest.from_json(json.dumps(data))
        assert m.format_version == version
        assert verify(tmp_path, m) == []
        assert json.loads(m.to_json())["formatVersion"] == version  # a re-written one keeps it


def test_an_unknown_version_is_refused_by_name_not_as_corrupt(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    data = json.loads(build(tmp_path, checksum=XXH3_128).to_json())
    data["formatVersion"] = 3
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(UnsupportedFormatVersion) as exc:
        read_manifest(tmp_path)
    assert exc.value.version == 3 and exc.value.field == "formatVersion"
    assert "unsupported version 3" in str(exc.value)
    assert "upgrade the runtime image" in str(exc.value)
    assert isinstance(exc.value, ContractError)  # callers that catch ContractError still do
