"""The real node's image store: which image archives containerd already holds, and importing the
others, at node start or ahead of it.

A cold `make demo` spent about 110 s importing the images into an empty store after the cluster
had started, while the Kubernetes build, minutes earlier, had left the disk idle and the images
ready. `preload` does that import during the build instead (prepare.py runs it after the images,
niced): a short-lived containerd on the node's own store, without its CRI plugin, which the node's
containerd then finds already filled. It holds the real node's lock meanwhile, and does nothing
when a cluster holds it (that node imports at its start, as before).

Standard library only: prepare.py runs it as a script before the venv exists.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

try:
    from .images import ensure_images
    from .processes import Process, wait_ready
except ImportError:  # run as a script (python3 hack/localcluster/image_store.py)
    from images import ensure_images  # type: ignore[no-redef]
    from processes import Process, wait_ready  # type: ignore[no-redef]

MARKER = "kubeckpt-imported.json"  # {image: archive imported}, in the store's root
LOCK = "realnode.lock"  # the real node's: one user of the store at a time
NAMESPACE = "k8s.io"  # the CRI plugin's, where the kubelet looks

Ctr = Callable[..., str]


def store_root(cache: Path, node: int = 0) -> Path:
    """Real node `node`'s image store: one per node, since a containerd holds its store's
    metadata database locked; node 0's is the one `preload` fills ahead of time, a further
    node's is filled at its first start and kept, like node 0's, across clusters."""
    return cache / "containerd" / ("root" if node == 0 else f"root-{node}")


def import_missing(ctr: Ctr, root: Path, archives: dict[str, Path]) -> list[str]:
    """Import each archive the store lacks: an image is current when the marker names this exact
    archive (its path carries the inputs' hash) and containerd lists it. Returns the images
    imported; raises RuntimeError when one is still missing after its import."""
    marker = root / MARKER
    try:
        done = json.loads(marker.read_text())
    except (OSError, ValueError):
        done = {}
    if not isinstance(done, dict):
        done = {}
    present = set(ctr("images", "ls", "-q").split())
    imported = []
    for name, archive in archives.items():
        if done.get(name) == str(archive) and name in present:
            continue
        ctr("images", "import", "--digests", "--snapshotter=overlayfs", str(archive), timeout=900)
        done[name] = str(archive)
        marker.write_text(json.dumps(done))  # after each: an interrupted run keeps what it did
        imported.append(name)
    missing = set(archives) - set(ctr("images", "ls", "-q").split())
    if missing:
        raise RuntimeError(f"images not in containerd after import: {sorted(missing)}")
    return imported


def containerd_socket(run: Path) -> Path:
    """The gRPC socket of a containerd whose state is under `run`: the one place that names it,
    so the config, the `ctr` calls and the kubelet's endpoint cannot disagree."""
    return run / "containerd.sock"


def ctr_call(sock: Path) -> Ctr:
    """`ctr` on `sock` in the CRI plugin's namespace: `ctr(*args, timeout=, check=)` returns its
    stdout and raises RuntimeError on a non-zero exit unless `check=False`."""

    def ctr(*args: str, timeout: float = 120, check: bool = True) -> str:
        argv = ["ctr", "--address", str(sock), "-n", NAMESPACE, *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-500:]}"
            )
        return p.stdout

    return ctr


def import_problem() -> str | None:
    """Why this machine cannot run a containerd to import images into the node's store (not
    root, containerd or ctr not installed yet), or None when it can."""
    if os.geteuid() != 0:
        return "not root (no real node)"
    missing = [c for c in ("containerd", "ctr") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed yet"
    return None


def containerd_config(root: Path, run: Path, *, cri: bool) -> str:
    """The head of a containerd config on the node's store (`root`), with its state and sockets
    under `run`: the real node's (which appends its CRI plugin's settings) and the preload's (which
    needs no CRI to import). Ends with the [metrics] table, so a caller may append plugins."""
    disabled = [] if cri else ["io.containerd.grpc.v1.cri"]
    disabled += [
        "io.containerd.snapshotter.v1.aufs",
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.zfs",
        "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.internal.v1.tracing",
    ]
    return f"""version = 2
root = "{root}"
state = "{run / "state"}"
disabled_plugins = {json.dumps(disabled)}

[grpc]
  address = "{containerd_socket(run)}"
[ttrpc]
  address = "{run / "containerd.sock.ttrpc"}"
[debug]
  address = "{run / "debug.sock"}"
[metrics]
  address = ""
"""


def preload(cache: Path) -> str:
    """Fill the node's image store from the built archives; a line saying what happened. Never
    raises for a machine that cannot run a node or a store in use: the node imports at start."""
    if why := import_problem():
        return f"skipped: {why} (the node imports at start)"
    cache.mkdir(parents=True, exist_ok=True)
    lock = os.open(cache / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "skipped: a cluster with a real node runs (it imports what it lacks)"
        archives = ensure_images(build=False)
        root = store_root(cache)
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kubeckpt-preload-") as tmp:
            return _import_with_own_containerd(root, Path(tmp), archives)
    finally:
        os.close(lock)


def _import_with_own_containerd(root: Path, run: Path, archives: dict[str, Path]) -> str:
    config = run / "config.toml"
    config.write_text(containerd_config(root, run, cri=False))
    ctr = ctr_call(containerd_socket(run))
    proc = Process("containerd", ["containerd", "--config", str(config)], run / "containerd.log")
    proc.start()
    try:
        wait_ready("containerd", proc, lambda: ctr("version", timeout=5), 30)
        t0 = time.monotonic()
        imported = import_missing(ctr, root, archives)
    finally:
        proc.stop(timeout=30)
    if not imported:
        return "the node's store already holds every image"
    return f"imported {', '.join(imported)} in {time.monotonic() - t0:.0f} s"


def main() -> int:
    cache = Path(os.environ.get("KUBECKPT_CACHE") or Path.home() / ".cache" / "kubeckpt")
    print("step node_images: start", flush=True)
    try:
        said = preload(cache)
    except Exception as e:  # the node imports at start: a failed preload costs only its time
        print(f"[images] preloading the node's store failed, the node imports at start: {e}")
        said = "failed"
    print(f"[images] node store: {said}", flush=True)
    print("step node_images: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
