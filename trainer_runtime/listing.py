"""`python -m trainer_runtime.listing`: the checkpoints this pod's tiers hold, as one JSON document.

`kubeckpt checkpoints JOB` runs it through pods/exec in the job's rank-0 pod, because only the pod
sees its storage (a PVC mounted there, the ramdisk tier, the object store's credentials). So it
lives in the runtime, which every injected training image has (installed, or copied in by the
zero-code init container), and uses only the standard library (fsspec for s3://, when installed).

Where to look comes from the env the webhook injected: CHECKPOINT_URI (persistent, with its
generations: `generation-<N>/` beside the root's own checkpoints, trainer_runtime/generations.py)
and CHECKPOINT_LOCAL_DIR (the ramdisk tier). It only reads: never verifies checksums (hashing a
large checkpoint would slow the training beside it), never follows a symlink, never removes
anything.
Everything is bounded, since a volume may hold anything: directory entries read per tier, files
walked per checkpoint, checkpoints listed (the newest first), and the size of the output, which
drops the oldest entries to fit and says so (`truncated`). The output is ASCII JSON
(`ensure_ascii`), so hostile names reach the CLI as escapes, never as terminal control bytes.

Per checkpoint `state` is one of:
- `complete`: manifest valid, sentinel gone, every listed file present with its size;
- `damaged`: manifest valid and sentinel gone, but files are missing or of another size (resume
  would reject it);
- `invalid`: sentinel gone, but the manifest is unreadable or breaks the contract;
- `writing`: the sentinel is there and its writer's heartbeat is live: it changed while the
  listing watched it (WATCH_SECONDS, once for all sentinels, only when there is one), the way
  handover.py tells, so no clock is compared with the storage's (a directory tier's sentinel by
  its mtime; an s3:// one by its body, which each beat re-uploads with a new counter);
- `incomplete`: anything else (no manifest, or a sentinel nobody touches: a crashed save).

Each checkpoint also says its `generation` (a local copy: the generation its run wrote) and its
`sequence` in commit order (from the manifest; None before sequences existed). They are listed
newest first: the latest generation first, and in it by commit order, checkpoints still without
a manifest first.

With `--verify` (`kubeckpt checkpoints --verify JOB`), every `complete` checkpoint of a filesystem
tier is also checked the way resume checks it (`layout.verify_checkpoint`: each file's content
hash against the manifest) and gets `verified`: true, or false with the reasons in `problems` and
state `damaged`; `damaged` and `invalid` ones get `verified: false` too; the others (being
written, never finished) and s3:// checkpoints are not checked (`verified: null`). A manifest of
a format version this runtime does not know is `invalid`, its problem naming the version.

The manifest records why a checkpoint was written (its `reason` key, MANIFEST_REASON); for a
manifest without one (written by an older runtime or another writer) the CLI falls back on the
TrainingProgress status, which holds the latest checkpoint's reason.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from .contract import (
    CHECKPOINT_LOCAL_DIR,
    CHECKPOINT_URI,
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    MANIFEST_REASON,
    MAX_MANIFEST_BYTES,
    ContractError,
    Manifest,
    checkpoint_dir_name,
    generation_dir_name,
    parse_checkpoint_dir_name,
    parse_generation_dir_name,
    verify,
)
from .contract.progress import format_rfc3339

FORMAT_VERSION: Final = 1
DEFAULT_MAX_ENTRIES: Final = 200
DEFAULT_MAX_BYTES: Final = 256 * 1024
MAX_DIR_ENTRIES: Final = 10_000  # directory entries read in one tier, its generations included
MAX_WALK_FILES: Final = 10_000  # files counted in one checkpoint without a manifest
MAX_PROBLEMS: Final = 5  # problems reported per checkpoint
MAX_TEXT: Final = 300  # characters of one problem or error message
MAX_SENTINEL_BYTES: Final = 4096  # of an s3:// sentinel's body read to tell a live heartbeat
# How long the listing watches sentinels for a heartbeat (every second, heartbeat.py): a writer
# whose sentinel changes meanwhile is live.
WATCH_SECONDS: Final = 2.5


def _text(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _time_of(seconds: float) -> str:
    return format_rfc3339(datetime.fromtimestamp(seconds, UTC))


def _walk_size(path: Path) -> tuple[int, int, bool]:
    """(files, bytes, capped) of the regular files under `path`, symlinks not followed."""
    files = size = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if files >= MAX_WALK_FILES:
                        return files, size, True
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        if entry.name in (MANIFEST_FILE, INCOMPLETE_SENTINEL):
                            continue
                        files += 1
                        size += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # unreadable subdirectory: count what can be read
    return files, size, False


def _read_manifest(path: Path) -> Manifest:
    """The manifest, read without following a symlinked manifest.json (OSError, ContractError)."""
    fd = os.open(path / MANIFEST_FILE, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ContractError("manifest.json is not a regular file")
        return Manifest.from_json(f.read(MAX_MANIFEST_BYTES + 1))


def _entry(tier: str, name: str, step: int, location: str, generation: int = 0) -> dict[str, Any]:
    """One checkpoint's entry before anything is known of it: incomplete until shown otherwise."""
    return {
        "tier": tier,
        "name": name,
        "step": step,
        "generation": generation,
        "sequence": None,
        "location": location,
        "complete": False,
        "state": "incomplete",
        "time": None,
        "bytes": None,
        "files": None,
        "problems": [],
    }


def _manifest_info(manifest: Manifest, tier: str) -> dict[str, Any]:
    """What an entry takes from the checkpoint's manifest (both kinds of tier: an s3:// one's
    reason was once left out, and the CLI then showed the TrainingProgress's in its place)."""
    info: dict[str, Any] = {"sequence": manifest.sequence}
    if tier == "local" and manifest.generation is not None:
        info["generation"] = manifest.generation  # the ramdisk has none: its run's
    reason = manifest.extra.get(MANIFEST_REASON)
    if isinstance(reason, str) and reason:
        info["reason"] = _text(reason)
    return info | {
        "time": manifest.time,
        "epoch": manifest.epoch,
        "worldSize": manifest.world_size,
        "framework": manifest.framework,
        "bytes": manifest.total_size,
        "files": len(manifest.files),
    }


def _sentinel_token(path: Path) -> int | None:
    """The sentinel's modification time, only to compare with a later look (never with a
    clock); opened first, so that an NFS client asks the server (handover.py)."""
    try:
        fd = os.open(path / INCOMPLETE_SENTINEL, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


def _s3_sentinel_token(fs: Any, key: str) -> bytes | None:
    """The sentinel object's body: its writer re-uploads it every HEARTBEAT_SECONDS with a new
    beat counter (heartbeat.start_upload), so two looks differ while the upload is alive. A GET
    each time, never a cached listing."""
    try:
        return bytes(fs.cat_file(key))[:MAX_SENTINEL_BYTES]
    except Exception:  # gone (the upload committed) or unreadable: not alive
        return None


def describe_checkpoint(
    path: Path, step: int, tier: str, generation: int = 0, *, content: bool = False
) -> dict[str, Any]:
    """What one `checkpoint-<step>` directory of a filesystem tier holds. A sentinel's heartbeat
    is not judged here (`watch_sentinels`): such an entry is `incomplete` for now. `content`:
    verify a complete one's content hashes too, as resume does (`verified`)."""
    info = _entry(tier, checkpoint_dir_name(step), step, str(path), generation)
    problems: list[str] = info["problems"]
    try:
        sentinel = os.lstat(path / INCOMPLETE_SENTINEL)
    except FileNotFoundError:
        sentinel = None
    except OSError as e:
        sentinel = None
        problems.append(_text(f"sentinel unreadable: {e.strerror}"))
    manifest: Manifest | None = None
    has_manifest = os.path.lexists(path / MANIFEST_FILE)
    if has_manifest:
        try:
            manifest = _read_manifest(path)
        except (OSError, ValueError) as e:  # ContractError is a ValueError
            problems.append(_text(f"unreadable manifest: {e}"))
    if manifest is not None:
        info.update(_manifest_info(manifest, tier))
        if manifest.tier != tier:
            problems.append(_text(f"manifest says tier {manifest.tier}"))
    else:
        files, size, capped = _walk_size(path)
        info.update(files=files, bytes=size)
        if capped:
            info["sizeIsPartial"] = True
        try:
            info["time"] = _time_of(os.lstat(path).st_mtime)
        except OSError:
            pass
    if sentinel is not None:
        info["_sentinel"] = (lambda: _sentinel_token(path), _sentinel_token(path))
    elif not has_manifest:
        problems.append("no manifest: the save did not finish")
    elif manifest is None:
        info["state"] = "invalid"
    else:
        found = verify(path, manifest, checksums=False)  # sizes only: cheap, no hashing
        if found:
            info["state"] = "damaged"
            problems.extend(_text(p) for p in found[:MAX_PROBLEMS])
            if len(found) > MAX_PROBLEMS:
                problems.append(f"... and {len(found) - MAX_PROBLEMS} more")
        else:
            info["state"] = "complete"
            info["complete"] = True
    if content:
        if info["state"] == "complete":
            _verify_content(path, info)
        elif info["state"] in ("damaged", "invalid"):
            info["verified"] = False
        else:
            info["verified"] = None
    del problems[MAX_PROBLEMS + 1 :]
    return info


def _verify_content(path: Path, info: dict[str, Any]) -> None:
    """Check a complete checkpoint's files against its manifest's hashes with resume's own code,
    and say so in `info` (`verified`, the problems, state `damaged` when they differ)."""
    from . import layout  # only here: hashing is what a plain listing must never do

    try:
        _, found = layout.verify_checkpoint(path, checksums=True)
    except ValueError as e:  # UnsupportedFormatVersion; a manifest changed under the listing
        found = [str(e)]
    except OSError as e:
        found = [f"unreadable: {e.strerror or e}"]
    info["verified"] = not found
    if found:
        info["state"], info["complete"] = "damaged", False
        info["problems"].extend(_text(p) for p in found[:MAX_PROBLEMS])


def watch_sentinels(
    checkpoints: list[dict[str, Any]], seconds: float, sleep: Callable[[float], None]
) -> None:
    """Settle the entries that have a sentinel: `writing` when it changed within `seconds` of
    watching (one wait for them all), `incomplete` with a problem otherwise. Each such entry
    carries `_sentinel`: (a probe giving the sentinel's token, or None when it cannot be read;
    the token at the first look)."""
    watched = [c for c in checkpoints if "_sentinel" in c]
    if watched and seconds > 0:
        sleep(seconds)
    for c in watched:
        probe, before = c.pop("_sentinel")
        after = probe()
        if before is not None and after is not None and after != before:
            c["state"] = "writing"
        else:
            c["problems"].insert(
                0, f"sentinel left behind (no heartbeat in {seconds:g} s): the save did not finish"
            )
            del c["problems"][MAX_PROBLEMS + 1 :]


def list_directory_tier(
    root: str, tier: str, *, content: bool = False
) -> tuple[list[dict[str, Any]], dict]:
    """The checkpoints of a filesystem tier, every generation, and the tier's own entry (root,
    error, capped). `content`: verify each complete one's content (`describe_checkpoint`)."""
    summary: dict[str, Any] = {"tier": tier, "root": _text(root), "error": None}
    found: list[dict[str, Any]] = []
    budget = MAX_DIR_ENTRIES
    directories: list[tuple[int, str]] = [(0, root)]
    while directories:
        generation, directory = directories.pop(0)
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    if budget <= 0:
                        summary["capped"] = True
                        break
                    budget -= 1
                    # Symlinks are not checkpoints (nor generations) to the runtime (layout.scan).
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    step = parse_checkpoint_dir_name(entry.name)
                    if step is not None:
                        found.append(
                            describe_checkpoint(
                                Path(entry.path), step, tier, generation, content=content
                            )
                        )
                    elif generation == 0 and (n := parse_generation_dir_name(entry.name)):
                        directories.append((n, entry.path))
        except FileNotFoundError:
            if generation == 0:
                summary["error"] = "does not exist (no checkpoint written yet?)"
        except OSError as e:
            where = "" if generation == 0 else f"{generation_dir_name(generation)}: "
            summary["error"] = _text(f"{where}unreadable: {e.strerror or e}")
    return found, summary


def list_s3_tier(uri: str, tier: str) -> tuple[list[dict[str, Any]], dict]:
    """The checkpoints under an s3:// URI, every generation (fsspec/s3fs, with the pod's AWS_*
    credentials). Without fsspec/s3fs the tier's `missing` names them."""
    summary: dict[str, Any] = {"tier": tier, "root": _text(uri), "error": None}
    found: list[dict[str, Any]] = []
    base = uri.rstrip("/")
    try:
        from .storage import S3Unavailable, _s3_filesystem

        fs = _s3_filesystem()
        root = base.split("://", 1)[1]
        names = [(0, root, str(k)) for k in fs.ls(root, detail=False)[:MAX_DIR_ENTRIES]]
    except S3Unavailable as e:
        # This Python lacks the packages: `missing` lets a caller name the image to change.
        summary.update(error=_text(f"cannot list: {e}"), missing=e.packages)
        return found, summary
    except FileNotFoundError:
        summary["error"] = "does not exist (no checkpoint written yet?)"
        return found, summary
    except Exception as e:  # a missing package, credentials, the network: say which, go on
        summary["error"] = _text(f"cannot list: {e}")
        return found, summary
    budget = MAX_DIR_ENTRIES - len(names)
    for _, _, key in list(names):
        n = parse_generation_dir_name(key.rstrip("/").rsplit("/", 1)[-1])
        if n is None or budget <= 0:
            continue
        prefix = f"{root}/{generation_dir_name(n)}"
        try:
            keys = [str(k) for k in fs.ls(prefix, detail=False)[:budget]]
        except Exception as e:
            summary["error"] = _text(f"{generation_dir_name(n)}: cannot list: {e}")
            continue
        budget -= len(keys)
        names += [(n, prefix, k) for k in keys]
    if budget <= 0:
        summary["capped"] = True
    for generation, prefix, key in names:
        name = key.rstrip("/").rsplit("/", 1)[-1]
        step = parse_checkpoint_dir_name(name)
        if step is None:
            continue
        where = prefix.removeprefix(root).lstrip("/")
        location = "/".join(p for p in (base, where, name) if p)
        info = _entry(tier, name, step, location, generation)
        try:
            objects = fs.find(f"{prefix}/{name}", detail=True)
            if not objects:
                # S3 has no directories: a prefix that holds no object is no checkpoint. Stores
                # that keep a real directory tree (SeaweedFS) still list the prefix of one that
                # retention deleted.
                continue
            rel = {k[len(prefix) + len(name) + 2 :]: v for k, v in list(objects.items())}
            if INCOMPLETE_SENTINEL in rel:
                # Live or left behind: watch_sentinels tells, as for a directory tier.
                key = f"{prefix}/{name}/{INCOMPLETE_SENTINEL}"
                token = _s3_sentinel_token(fs, key)
                info["_sentinel"] = (lambda key=key: _s3_sentinel_token(fs, key), token)
            data = rel.get(MANIFEST_FILE)
            if data is not None and int(data.get("size") or 0) <= MAX_MANIFEST_BYTES:
                manifest = Manifest.from_json(fs.cat_file(f"{prefix}/{name}/{MANIFEST_FILE}"))
                info.update(_manifest_info(manifest, tier))
                missing = [f.path for f in manifest.files if f.path not in rel]
                if INCOMPLETE_SENTINEL in rel:
                    pass  # being uploaded, or left behind: watch_sentinels says which
                elif missing:
                    info["state"] = "damaged"
                    info["problems"].append(_text(f"missing file: {missing[0]}"))
                else:
                    info["state"], info["complete"] = "complete", True
            else:
                others = [v for k, v in rel.items() if k != INCOMPLETE_SENTINEL]
                info.update(files=len(others), bytes=sum(int(v.get("size") or 0) for v in others))
                if INCOMPLETE_SENTINEL not in rel:
                    info["problems"].append("no manifest: the upload did not finish")
        except (OSError, ValueError) as e:
            info["state"] = "invalid"
            info["problems"].append(_text(f"unreadable manifest: {e}"))
        found.append(info)
    return found, summary


def newest_first(checkpoint: dict[str, Any]) -> tuple:
    """Sort key: the latest generation first; in it, by commit order, the newest first, those
    without a usable manifest (being written, or never finished) before the others, and a
    manifest from before sequences after every one with a sequence; then by step."""
    sequence = checkpoint.get("sequence")
    if isinstance(sequence, int):
        order: float = sequence
    else:
        order = 0 if checkpoint["state"] in ("complete", "damaged") else float("inf")
    return (-checkpoint["generation"], -order, -checkpoint["step"], checkpoint["tier"])


def listing(
    persistent: str | None,
    local: str | None,
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    now: float | None = None,
    watch: float = WATCH_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    content: bool = False,
) -> dict[str, Any]:
    """The document `main` prints: both tiers' checkpoints, newest first (`newest_first`).
    `watch`: how long to watch sentinels for a live writer (only when there is one). `content`
    (`--verify`): check each complete checkpoint's content hashes, as resume does."""
    now = time.time() if now is None else now
    checkpoints: list[dict[str, Any]] = []
    tiers: list[dict[str, Any]] = []
    for tier, root in (("persistent", persistent), ("local", local)):
        if not root:
            continue
        if root.startswith("file://"):
            root = root[len("file://") :]
        if "://" in root:
            if root.split("://", 1)[0].lower() == "s3":
                found, summary = list_s3_tier(root, tier)
                if content:
                    summary["error"] = summary["error"] or "--verify checks filesystem tiers only"
            else:
                found, summary = [], {"tier": tier, "root": root, "error": "unsupported scheme"}
        else:
            found, summary = list_directory_tier(root, tier, content=content)
        checkpoints += found
        tiers.append(summary)
    watch_sentinels(checkpoints, watch, sleep)
    checkpoints.sort(key=newest_first)
    truncated = len(checkpoints) > max_entries
    return {
        "formatVersion": FORMAT_VERSION,
        "time": _time_of(now),
        "tiers": tiers,
        "checkpoints": checkpoints[:max_entries],
        "total": len(checkpoints),
        "truncated": truncated,
    }


def render(doc: dict[str, Any], max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """`doc` as one line of ASCII JSON of at most `max_bytes` (tier entries are short): the
    oldest checkpoints are left out to fit, and `truncated` says so."""

    def dump(value: object) -> str:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)

    entries = [dump(c) for c in doc["checkpoints"]]
    budget = max_bytes - len(dump(dict(doc, checkpoints=[], truncated=False)))
    kept = 0
    for entry in entries:
        budget -= len(entry) + 1  # and its comma
        if budget < 0:
            break
        kept += 1
    truncated = bool(doc.get("truncated")) or kept < len(entries)
    return dump(dict(doc, checkpoints=doc["checkpoints"][:kept], truncated=truncated))


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m trainer_runtime.listing",
        description="List this pod's checkpoints (read-only) as JSON, for `kubeckpt checkpoints`.",
    )
    parser.add_argument("--persistent", default=env.get(CHECKPOINT_URI, ""))
    parser.add_argument("--local", default=env.get(CHECKPOINT_LOCAL_DIR, ""))
    parser.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument(
        "--verify", action="store_true", help="also check every complete checkpoint's content"
    )
    args = parser.parse_args(argv)
    if args.max_entries < 1 or args.max_bytes < 1024:
        parser.error("--max-entries must be >= 1 and --max-bytes >= 1024")
    doc = listing(
        args.persistent or None,
        args.local or None,
        max_entries=args.max_entries,
        content=args.verify,
    )
    sys.stdout.write(render(doc, args.max_bytes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
