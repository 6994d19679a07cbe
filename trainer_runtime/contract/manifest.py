"""The checkpoint manifest: `<CHECKPOINT_URI>/checkpoint-<step>/manifest.json`.

A checkpoint is complete only when its manifest exists and the incomplete-sentinel is gone. The
manifest lists every file with its size and a checksum, so resume can verify a checkpoint before
trusting it, whichever tier (local ramdisk or persistent storage) it comes from.

Checksums: each `files[]` entry carries one (or more) under the algorithm's name: `sha256` (64 hex
digits; what every manifest before 2026-11 holds, and the HF path still writes) or `xxh3_128` (32
hex digits; XXH3-128, about 12x faster than SHA-256 on one core: a non-cryptographic hash that
catches corruption and truncation, not tampering). Readers verify with the first one they can
compute. This module needs nothing beyond the standard library: `xxh3_128` is computed with the
optional `xxhash` package (the `torch` extra installs it), imported only when a manifest uses it.

`formatVersion`: 1 for a manifest whose files carry `sha256` only, 2 once any file carries
`xxh3_128`, so a runtime image that knows only version 1 refuses such a manifest by its version
(UnsupportedFormatVersion: "upgrade the runtime image") instead of calling its files corrupt.
Writers stamp the lowest version that describes what they wrote, so a sha256-only checkpoint stays
readable by every runtime; readers accept every version in FORMAT_VERSIONS, and version 1
manifests that already carry `xxh3_128` (written before version 2 existed) too.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import mmap
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

from ..fsutil import write_atomic
from .env import INCOMPLETE_SENTINEL, MANIFEST_FILE
from .errors import ContractError, UnsupportedFormatVersion, describe
from .progress import MAX_COUNT, format_rfc3339, json_type, parse_rfc3339

FORMAT_VERSION: Final = 2  # the newest this module writes (see the module docstring)
FORMAT_VERSIONS: Final = (1, 2)  # what this module reads
TIERS: Final = ("local", "persistent")
# An additive key beside DESIGN.md's (docs/contract.md): why the checkpoint was written, one of
# progress.py's REASON_* ("periodic", "jit"); absent in manifests written before it existed.
MANIFEST_REASON: Final = "reason"
# Additive keys too (docs/contract.md), absent in manifests written before generations existed:
# the checkpoint's place in commit order, 1 + the highest in its generation when it was committed,
# decided by the committing rank (no wall clock, so nodes' clocks never need to agree); readers
# order a manifest without one before every manifest with one. Retention and resume go by it.
MANIFEST_SEQUENCE: Final = "sequence"
# The generation of CHECKPOINT_URI the writing run saves to (0: the root itself). A persistent
# checkpoint's directory says it too; a local-tier copy (no generations on the ramdisk) needs it to
# tell a resumed run where to go on writing.
MANIFEST_GENERATION: Final = "generation"
# Additive too (issue 28): in a local-tier manifest with peer copies on, where the node's copy is
# kept: {"node": the ring successor's node index, "pod": its pod}. Absent otherwise.
MANIFEST_PEER_COPY: Final = "peerCopy"
HASH_CHUNK_BYTES: Final = 1024 * 1024
MMAP_MIN_BYTES: Final = 16 * 1024 * 1024  # hash_file maps files from this size on
MAX_MANIFEST_BYTES: Final = 16 * 1024 * 1024  # sharded checkpoints list thousands of files
MAX_FRAMEWORK_LENGTH: Final = 64

_MANIFEST_KEYS: Final = frozenset(
    {"formatVersion", "step", "epoch", "time", "worldSize", "framework", "tier", "files"}
)
SHA256: Final = "sha256"
XXH3_128: Final = "xxh3_128"
# Known checksums: name (the key in a files[] entry) -> hex digits. Verification prefers the first.
CHECKSUM_ALGORITHMS: Final = {XXH3_128: 32, SHA256: 64}
_FILE_KEYS: Final = frozenset({"path", "size", *CHECKSUM_ALGORITHMS})
_HEX = frozenset("0123456789abcdef")
# Files that are never part of the checkpoint's content: the manifest itself (it cannot hold its own
# checksum), the sentinel, and the temp file a crashed write_manifest_atomic may have left behind.
_ALWAYS_EXCLUDED: Final = (MANIFEST_FILE, INCOMPLETE_SENTINEL, f".{MANIFEST_FILE}.*.tmp")


def _check_int(path: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{path}: expected integer, got {json_type(value)}", field=path)
    if not minimum <= value <= MAX_COUNT:
        raise ContractError(
            f"{path}: must be between {minimum} and {MAX_COUNT}, got {describe(value)}", field=path
        )
    return value


def _check_str(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise ContractError(f"{path}: expected string, got {json_type(value)}", field=path)
    return value


def check_relative_path(path: object, where: str = "path") -> str:
    """Raise ContractError unless `path` is a clean relative POSIX path inside the checkpoint.

    Rejects absolute paths, '..', '.', empty segments and backslashes, so a manifest can never
    make verify() or a tier copy reach outside the checkpoint directory.
    """
    path = _check_str(where, path)
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or any(part in ("", ".", "..") for part in path.split("/"))
    )
    if bad:
        raise ContractError(
            f"{where}: must be a relative POSIX path inside the checkpoint, got {describe(path)}",
            field=where,
        )
    if path in (MANIFEST_FILE, INCOMPLETE_SENTINEL):
        raise ContractError(f"{where}: {path} cannot be listed in the manifest", field=where)
    return path


def _check_digest(where: str, algorithm: str, digest: object) -> str:
    digits = CHECKSUM_ALGORITHMS[algorithm]
    text = _check_str(f"{where}.{algorithm}", digest)
    if len(text) != digits or not set(text) <= _HEX:
        raise ContractError(
            f"{where}.{algorithm}: expected {digits} lowercase hex digits, got {describe(text)}",
            field=f"{where}.{algorithm}",
        )
    return text


def _check_file_fields(
    where: str, path: object, size: object, digests: dict[str, object], extra: object
) -> None:
    check_relative_path(path, f"{where}.path")
    _check_int(f"{where}.size", size, 0)
    present = {alg: d for alg, d in digests.items() if d is not None}
    if not present:
        raise ContractError(
            f"{where}.sha256: required field is missing (a file needs a checksum: "
            f"{' or '.join(sorted(CHECKSUM_ALGORITHMS))})",
            field=f"{where}.sha256",
        )
    for alg, digest in present.items():
        _check_digest(where, alg, digest)
    if not isinstance(extra, dict) or any(k in _FILE_KEYS for k in extra):
        raise ContractError(f"{where}: extra must be a dict without known keys", field=where)


def checksum_available(algorithm: str) -> bool:
    """Whether this process can compute `algorithm` (xxh3_128 needs the xxhash package)."""
    if algorithm == SHA256:
        return True
    if algorithm == XXH3_128:
        return _xxhash() is not None
    return False


def preferred_checksum() -> str:
    """The checksum a writer should use here: xxh3_128 where xxhash is installed, else sha256."""
    return XXH3_128 if checksum_available(XXH3_128) else SHA256


def new_hasher(algorithm: str) -> Any:
    """A hashlib-like object (`update`, `hexdigest`) for `algorithm`; ContractError if this
    process cannot compute it. Both kinds release the GIL while hashing large buffers."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3_128:
        module = _xxhash()
        if module is None:
            raise ContractError("xxh3_128 checksums need the xxhash package (pip install xxhash)")
        return module.xxh3_128()
    raise ContractError(f"unknown checksum algorithm {describe(algorithm)}")


def format_checksum(algorithm: str, hexdigest: str) -> str:
    """One string for a file's checksum, as writers report it through the save protocol: a bare
    hex SHA-256 (what reports always held), or `<algorithm>:<hex>` for any other algorithm."""
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise ContractError(f"unknown checksum algorithm {describe(algorithm)}")
    return hexdigest if algorithm == SHA256 else f"{algorithm}:{hexdigest}"


def parse_checksum(text: str) -> tuple[str, str]:
    """(algorithm, hex digest) of a `format_checksum` string; ContractError when malformed."""
    algorithm, sep, digest = text.partition(":")
    if not sep:
        algorithm, digest = SHA256, text
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise ContractError(f"unknown checksum algorithm {describe(algorithm)}")
    return algorithm, _check_digest("checksum", algorithm, digest)


@functools.cache
def _xxhash() -> Any:
    """The xxhash module, or None where it is not installed."""
    try:
        import xxhash  # optional: the torch extra installs it
    except ImportError:
        return None
    return xxhash


@dataclass(frozen=True)
class ManifestFile:
    """One file of a checkpoint: relative POSIX path, size in bytes, and at least one checksum
    (lowercase hex): `sha256` and/or `xxh3_128`.

    The fields are named for their algorithms, as the keys on disk are. A writer's report
    (`format_checksum`: a bare SHA-256 digest or `<algorithm>:<hex>`) goes in through
    `from_checksum`; `sha256` also still accepts such a string and stores it under its own
    algorithm.
    """

    path: str
    size: int
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    xxh3_128: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sha256, str) and ":" in self.sha256:
            algorithm, digest = parse_checksum(self.sha256)
            object.__setattr__(self, "sha256", None)
            if getattr(self, algorithm) not in (None, digest):
                raise ContractError(f"file.{algorithm}: two different values", field="file")
            object.__setattr__(self, algorithm, digest)
        _check_file_fields("file", self.path, self.size, self.checksums, self.extra)

    @property
    def checksums(self) -> dict[str, str]:
        """Every checksum given, by algorithm, in order of preference."""
        found = {alg: getattr(self, alg) for alg in CHECKSUM_ALGORITHMS}
        return {alg: d for alg, d in found.items() if d is not None}

    @property
    def checksum(self) -> tuple[str, str]:
        """(algorithm, hex digest) to verify with: the first this process can compute, else the
        first given (verify then says what is missing)."""
        given = self.checksums
        for alg, digest in given.items():
            if checksum_available(alg):
                return alg, digest
        return next(iter(given.items()))

    @classmethod
    def from_checksum(cls, path: str, size: int, checksum: str) -> ManifestFile:
        """The entry of a file a writer reported: `checksum` as `format_checksum` wrote it,
        stored under its algorithm (ContractError when malformed)."""
        algorithm, digest = parse_checksum(checksum)
        return cls(path=path, size=size, **{algorithm: digest})

    @classmethod
    def from_dict(cls, data: object, where: str = "file") -> ManifestFile:
        """Validate one decoded `files[]` entry; `where` (e.g. "files[3]") prefixes messages."""
        if not isinstance(data, dict):
            raise ContractError(f"{where}: expected object, got {json_type(data)}", field=where)
        for key in ("path", "size"):
            if key not in data:
                raise ContractError(
                    f"{where}.{key}: required field is missing", field=f"{where}.{key}"
                )
        # A present key must hold a digest (null included is an error); absent ones are None.
        digests = {alg: data[alg] for alg in CHECKSUM_ALGORITHMS if alg in data}
        for alg, digest in digests.items():
            _check_digest(where, alg, digest)
        extra = {k: v for k, v in data.items() if k not in _FILE_KEYS}
        _check_file_fields(where, data["path"], data["size"], digests, extra)
        return cls(path=data["path"], size=data["size"], extra=extra, **digests)

    def to_dict(self) -> dict[str, Any]:
        # sha256 keeps its place after size: manifests written before xxh3_128 look the same.
        digests = {a: getattr(self, a) for a in (SHA256, XXH3_128) if getattr(self, a) is not None}
        return {"path": self.path, "size": self.size, **digests, **self.extra}


@dataclass
class Manifest:
    """What `manifest.json` holds. `time` is RFC 3339; `tier` is "local" or "persistent"."""

    step: int
    epoch: int
    time: str
    world_size: int
    framework: str
    tier: str
    files: list[ManifestFile] = field(default_factory=list)
    # None: the lowest version describing `files` (a writer's); a read manifest keeps its own.
    format_version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format_version is None and isinstance(self.files, list):
            self.format_version = required_format_version(self.files)
        self.validate()

    def validate(self) -> None:
        v = _check_int("formatVersion", self.format_version, 1)
        if v not in FORMAT_VERSIONS:
            # A newer layout may mean something this reader cannot check: refuse, don't guess,
            # and never take it for a corrupt checkpoint.
            raise UnsupportedFormatVersion(v, FORMAT_VERSIONS)
        _check_int("step", self.step, 0)
        _check_int("epoch", self.epoch, 0)
        try:
            parse_rfc3339(_check_str("time", self.time))
        except ContractError:
            raise ContractError(
                f"time: expected an RFC 3339 timestamp, got {describe(self.time)}", field="time"
            ) from None
        _check_int("worldSize", self.world_size, 1)
        fw = _check_str("framework", self.framework)
        if not fw or len(fw) > MAX_FRAMEWORK_LENGTH or not fw.isprintable():
            raise ContractError(
                f"framework: expected a short name, got {describe(fw)}", field="framework"
            )
        if self.tier not in TIERS:
            raise ContractError(
                f"tier: must be one of {', '.join(TIERS)}, got {describe(self.tier)}", field="tier"
            )
        if not isinstance(self.files, list):
            raise ContractError(
                f"files: expected array, got {json_type(self.files)}", field="files"
            )
        seen: set[str] = set()
        for i, entry in enumerate(self.files):
            if not isinstance(entry, ManifestFile):
                raise ContractError(f"files[{i}]: expected ManifestFile", field=f"files[{i}]")
            if entry.path in seen:
                raise ContractError(
                    f"files[{i}].path: duplicate path {describe(entry.path)}",
                    field=f"files[{i}].path",
                )
            seen.add(entry.path)
        if not isinstance(self.extra, dict) or any(k in _MANIFEST_KEYS for k in self.extra):
            raise ContractError("extra: must be a dict without known keys", field="extra")
        if MANIFEST_SEQUENCE in self.extra:
            _check_int(MANIFEST_SEQUENCE, self.extra[MANIFEST_SEQUENCE], 1)
        if MANIFEST_GENERATION in self.extra:
            _check_int(MANIFEST_GENERATION, self.extra[MANIFEST_GENERATION], 0)

    @property
    def sequence(self) -> int | None:
        """Its place in commit order (MANIFEST_SEQUENCE); None for a manifest without one."""
        return self.extra.get(MANIFEST_SEQUENCE)

    @property
    def generation(self) -> int | None:
        """The generation its run wrote (MANIFEST_GENERATION); None for a manifest without one."""
        return self.extra.get(MANIFEST_GENERATION)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "formatVersion": self.format_version,
            "step": self.step,
            "epoch": self.epoch,
            "time": self.time,
            "worldSize": self.world_size,
            "framework": self.framework,
            "tier": self.tier,
            "files": [f.to_dict() for f in self.files],
            **self.extra,
        }

    def to_json(self) -> str:
        self.validate()
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        if not isinstance(data, dict):
            raise ContractError(f"manifest must be a JSON object, got {json_type(data)}")
        for key in ("formatVersion", "step", "epoch", "time", "worldSize", "framework", "tier"):
            if key not in data:
                raise ContractError(f"{key}: required field is missing", field=key)
        files_raw = data.get("files", [])
        if not isinstance(files_raw, list):
            raise ContractError(f"files: expected array, got {json_type(files_raw)}", field="files")
        files = [ManifestFile.from_dict(item, f"files[{i}]") for i, item in enumerate(files_raw)]
        return cls(
            step=data["step"],
            epoch=data["epoch"],
            time=data["time"],
            world_size=data["worldSize"],
            framework=data["framework"],
            tier=data["tier"],
            files=files,
            format_version=data["formatVersion"],
            extra={k: v for k, v in data.items() if k not in _MANIFEST_KEYS},
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> Manifest:
        size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
        if size > MAX_MANIFEST_BYTES:
            raise ContractError(f"manifest is {size} bytes, over the limit of {MAX_MANIFEST_BYTES}")
        try:
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            obj = json.loads(text, parse_constant=_reject_constant)
        except UnicodeDecodeError as e:
            raise ContractError(f"manifest is not valid UTF-8: {e}") from None
        except RecursionError:
            raise ContractError("manifest is not valid JSON: nested too deeply") from None
        except ContractError:
            raise
        except ValueError as e:  # JSONDecodeError is a ValueError
            raise ContractError(f"manifest is not valid JSON: {e}") from None
        return cls.from_dict(obj)


def required_format_version(files: Iterable[ManifestFile]) -> int:
    """The lowest formatVersion that describes `files`: 2 once any carries xxh3_128, else 1."""
    return 2 if any(f.xxh3_128 is not None for f in files) else 1


def _reject_constant(name: str) -> Any:
    raise ContractError(f"manifest is not valid JSON: {name} is not allowed")


def hash_file(path: str | os.PathLike[str], algorithm: str = SHA256) -> tuple[int, str]:
    """(size, hex digest) of a file.

    A large file is hashed straight from the page cache through a read-only mapping (no copy:
    with XXH3 that halves the time), the rest in 1 MiB chunks into one reused buffer, which stays
    in the CPU cache between the read and the hash. The size is that of the bytes hashed.
    """
    digest = new_hasher(algorithm)
    size = 0
    with open(path, "rb", buffering=0) as f:
        mapped = os.fstat(f.fileno()).st_size
        if mapped >= MMAP_MIN_BYTES and hasattr(mmap, "MAP_POPULATE"):
            try:
                # MAP_POPULATE: the whole range in one call instead of a page fault per 4 KiB.
                # (A file truncated by someone else while mapped would raise SIGBUS; a
                # checkpoint's files are never rewritten once the manifest exists.)
                with mmap.mmap(
                    f.fileno(),
                    mapped,
                    flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                    prot=mmap.PROT_READ,
                ) as mapping:
                    digest.update(mapping)
                size = mapped
                f.seek(size)
            except (OSError, ValueError):  # a filesystem that cannot map: read it instead
                digest = new_hasher(algorithm)
        buf = bytearray(HASH_CHUNK_BYTES)
        view = memoryview(buf)
        while n := f.readinto(buf):  # all of it, or what grew after the mapping
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def build_manifest(
    directory: str | os.PathLike[str],
    *,
    step: int,
    epoch: int,
    world_size: int,
    framework: str,
    tier: str,
    exclude: Iterable[str] = (),
    time: str | None = None,
    extra: dict[str, Any] | None = None,
    checksum: str = SHA256,
) -> Manifest:
    """Walk `directory` and describe every regular file in it (sorted by path).

    `manifest.json` and the sentinel are always left out; `exclude` adds fnmatch patterns matched
    against the relative POSIX path. Symlinks and special files raise ContractError: a checkpoint
    must be self-contained so it survives a copy between tiers. `time` defaults to now (UTC).
    `checksum` is the algorithm every file is hashed with.
    """
    root = Path(directory)
    patterns = (*_ALWAYS_EXCLUDED, *exclude)
    files: list[ManifestFile] = []
    # onerror re-raises: a directory we cannot read must fail the manifest, not shrink it.
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]):
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            if _excluded(rel, patterns):
                continue
            mode = os.lstat(full).st_mode
            if not stat.S_ISREG(mode):
                raise ContractError(
                    f"{rel}: not a regular file (symlink or special file)", field=rel
                )
            size, digest = hash_file(full, checksum)
            files.append(ManifestFile.from_checksum(rel, size, format_checksum(checksum, digest)))
    files.sort(key=lambda f: f.path)
    return Manifest(
        step=step,
        epoch=epoch,
        time=time if time is not None else format_rfc3339(),
        world_size=world_size,
        framework=framework,
        tier=tier,
        files=files,
        extra=dict(extra or {}),
    )


def _raise(error: OSError) -> None:
    raise error


def verify(
    directory: str | os.PathLike[str], manifest: Manifest, *, checksums: bool = True
) -> list[str]:
    """The problems found checking `directory` against `manifest`; empty when it matches.

    Each problem is one line naming the file: missing, not a regular file, outside the directory
    (through a symlinked parent), size mismatch, or checksum mismatch (only with `checksums`,
    and only when the size matched, since then the content is already known to differ). With
    `checksums`, a file whose only checksum this process cannot compute is a problem too: it is
    never trusted unchecked.
    """
    root = Path(directory)
    real_root = os.path.realpath(root)
    problems: list[str] = []
    for entry in manifest.files:
        full = root.joinpath(*PurePosixPath(entry.path).parts)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            problems.append(f"missing file: {entry.path}")
            continue
        except OSError as e:
            problems.append(f"unreadable file: {entry.path}: {e.strerror}")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"not a regular file: {entry.path}")
            continue
        if os.path.commonpath([real_root, os.path.realpath(full)]) != real_root:
            problems.append(f"outside the checkpoint directory: {entry.path}")
            continue
        if st.st_size != entry.size:
            problems.append(
                f"size mismatch: {entry.path}: expected {entry.size} bytes, found {st.st_size}"
            )
            continue
        if checksums:
            algorithm, _ = entry.checksum
            if not checksum_available(algorithm):
                problems.append(
                    f"cannot check {algorithm}: {entry.path}: install the xxhash package"
                )
                continue
            try:
                size, digest = hash_file(full, algorithm)
            except OSError as e:
                problems.append(f"unreadable file: {entry.path}: {e.strerror}")
                continue
            if (problem := content_problem(entry, size, digest)) is not None:
                problems.append(problem)
    return problems


def content_problem(entry: ManifestFile, size: int, digest: str) -> str | None:
    """What is wrong with a file read as `size` bytes hashing to `digest` (hex, with the entry's
    own algorithm, `entry.checksum`), or None when that is what `entry` describes."""
    algorithm, expected = entry.checksum
    if size != entry.size:  # changed while it was read
        return f"size mismatch: {entry.path}: expected {entry.size} bytes, found {size}"
    if digest != expected:
        return f"checksum mismatch: {entry.path}: expected {algorithm} {expected}, got {digest}"
    return None


def write_manifest_atomic(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write `directory/manifest.json` so readers see the old state or the whole new file.

    Temp file in the same directory, fsync, rename over, fsync the directory (so the rename
    itself survives a node crash). Returns the manifest's path.
    """
    target = Path(directory, MANIFEST_FILE)
    # 0644, not mkstemp's 0600: other containers of the pod may read it.
    write_atomic(target, manifest.to_json().encode("utf-8"), mode=0o644)
    return target


def read_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """Load `directory/manifest.json` (ContractError when invalid; OSError when unreadable)."""
    path = Path(directory, MANIFEST_FILE)
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    return Manifest.from_json(data)


def sequence_of(data: bytes) -> int | None:
    """The MANIFEST_SEQUENCE of a manifest's bytes, or None (none, or not a manifest). Only that
    key is checked, not every file entry: retention and the next commit read it from each
    checkpoint of a generation, and a sharded checkpoint's manifest lists thousands of files.
    A manifest invalid elsewhere is still refused where it matters, by restore."""
    if len(data) > MAX_MANIFEST_BYTES:
        return None
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, ContractError, RecursionError):
        return None
    value = obj.get(MANIFEST_SEQUENCE) if isinstance(obj, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        return None
    return value


def read_sequence(directory: str | os.PathLike[str]) -> int | None:
    """`sequence_of` the manifest in `directory` (OSError when it cannot be read)."""
    with open(Path(directory, MANIFEST_FILE), "rb") as f:
        return sequence_of(f.read(MAX_MANIFEST_BYTES + 1))


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """DESIGN.md's completeness rule: the manifest exists and the sentinel is gone.

    Says nothing about the content; call verify() before trusting the files.
    """
    return Path(directory, MANIFEST_FILE).is_file() and not os.path.lexists(
        Path(directory, INCOMPLETE_SENTINEL)
    )
