"""kubeckpt's JAX adapter beside orbax-checkpoint's own CheckpointManager (issue 14).

Usage: PYTHONPATH=.:hack/bench python hack/bench/jax_peers.py [--dir DIR] [--local-dir DIR]
       [--gib 0.75] [--batch 256] [--rounds 3] [--only NAME,NAME] [--device cpu|gpu]

In one process on one device (CPU by default; `--device gpu`: the first GPU, the async peers
only, 2 rounds, and the device's bytes in use around each save call), on the same MLP train state
(parameters + Adam mu and nu, written out here so that only jax, numpy and orbax are needed; built
from a config: nothing downloaded) and the same disk, each round runs every peer once, in
an order rotated from round to round. The jitted train step donates the state's buffers
(donate_argnums), as real JAX loops do, so a save must not read them after the next step starts.

  kubeckpt.sync   CheckpointManager.save(step, state, blocking=True), async_save=False:
                  the persistent tier (kubeckpt's per-process format, one process: each
                  array's bytes hashed with XXH3 while written, one fsync; then the
                  manifest)                                                            (sync)
  kubeckpt.async  CheckpointManager.save(step, state, blocking=False): a host snapshot
                  (on CPU numpy views, which keep XLA from donating those buffers), then
                  the writer thread persists while training steps on                  (async)
  kubeckpt.copy   the same with snapshot="copy": the arrays copied into host buffers
                  reused from save to save                                             (async)
  kubeckpt.orbax  the same with persistent_format="orbax" (the format kept where several
                  processes write one shared directory): orbax's own async save into a
                  staging directory, then on the writer thread kubeckpt's fsync of
                  orbax's files, the rename into checkpoint-<step>/, XXH3 of every file
                  read back, and the manifest                                         (async)
  kubeckpt.local  step_end() at a multiple of CHECKPOINT_LOCAL_PERIOD: the local tier
                  alone (kubeckpt's raw per-process format) in CHECKPOINT_LOCAL_DIR,
                  by default a directory on /dev/shm, the ramdisk the tier is meant for (async)
  orbax.sync      ocp.CheckpointManager(enable_async_checkpointing=False), StandardSave (sync)
  orbax.async     ocp.CheckpointManager(enable_async_checkpointing=True, max_to_keep=1),
                  StandardSave; durable when wait_until_finished() returns             (async)

kubeckpt gets the environment the webhook would inject (`environ=`). For each peer: the training
stall (the save call, plus any wait before the next step can start), the time until durable
(kubeckpt: its result's save_seconds, from the call until the manifest is fsynced; orbax async: a
helper thread returns from wait_until_finished()), the training time lost per checkpoint (from the
save call to the end of the first step that ends after the checkpoint is durable, minus that many
steps at the undisturbed step time: the median of 3 steps before and 3 after), and restore into
the live sharding from an abstract state (ShapeDtypeStruct with the live sharding) on a fresh
manager: kubeckpt from the persistent tier and from the local tier, with every file's XXH3
checksum verified (the default) and with sizes only; orbax's own restore (StandardRestore).
Every restore is compared bitwise with a host copy of the state taken at the save, and its
sharding with the live one. Each peer has had one untimed checkpoint before round 1. Ratios
are printed only where the two ranges (min-max over the rounds) do not overlap.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import jax
from absl import logging as absl_logging

absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on read_only managers

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from benchstats import ratio, spread  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from trainer_runtime.jax import CheckpointManager  # noqa: E402

warnings.filterwarnings("ignore", module="orbax")
RAW_CHUNK = 1024 * 1024
WIDTH = 4096
LOCAL_PERIOD = 10  # CHECKPOINT_LOCAL_PERIOD for kubeckpt.local; it saves at multiples of it


# ---------------------------------------------------------------------- the training loop


class Loop:
    """An MLP of `layers` Linear(WIDTH, WIDTH) + tanh, optax Adam; one step = the jitted
    forward, backward and update, the state's buffers donated; the step blocks until done."""

    def __init__(self, gib: float, batch: int) -> None:
        mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
        self.sharding = NamedSharding(mesh, P())
        per_layer = WIDTH * WIDTH + WIDTH
        layers = max(1, round(gib * 1024**3 / (3 * 4 * per_layer)))
        lr, b1, b2, eps = 1e-4, 0.9, 0.999, 1e-8  # optax.adam's defaults

        def init(key: jax.Array) -> dict[str, Any]:
            params = [
                {
                    "w": jax.random.normal(jax.random.fold_in(key, i), (WIDTH, WIDTH))
                    / np.sqrt(WIDTH),
                    "b": jnp.zeros(WIDTH),
                }
                for i in range(layers)
            ]
            zeros = jax.tree.map(jnp.zeros_like, params)
            return {
                "params": params,
                "opt": {"mu": zeros, "nu": zeros},
                "step": jnp.zeros((), "int32"),
            }

        def loss_fn(params: Any, x: jax.Array) -> jax.Array:
            h = x
            for layer in params:
                h = jnp.tanh(h @ layer["w"] + layer["b"])
            return jnp.mean(jnp.square(h - 0.5))

        @functools.partial(jax.jit, donate_argnums=0)
        def train_step(state: Any, x: jax.Array) -> tuple[Any, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(state["params"], x)
            t = state["step"] + 1
            mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["opt"]["mu"], grads)
            nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["opt"]["nu"], grads)
            c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
            params = jax.tree.map(
                lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                state["params"],
                mu,
                nu,
            )
            return {"params": params, "opt": {"mu": mu, "nu": nu}, "step": t}, loss

        self.layers = layers
        self.state = jax.jit(init, out_shardings=self.sharding)(jax.random.key(0))
        self.x = jax.device_put(jax.random.normal(jax.random.key(1), (batch, WIDTH)), self.sharding)
        self.train_step = train_step
        self.step()  # compile; Adam's moments become dense
        self.step()

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in jax.tree.leaves(self.state))

    def step(self) -> float:
        t0 = time.monotonic()
        self.state, _ = self.train_step(self.state, self.x)
        jax.block_until_ready(self.state)
        return time.monotonic() - t0

    def abstract(self) -> Any:
        """What a restarted job has before restore: shapes, dtypes, the live sharding."""
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.state
        )

    def snapshot(self) -> list[np.ndarray]:
        return [np.array(x, copy=True) for x in jax.tree.leaves(self.state)]

    def check(self, restored: Any, reference: list[np.ndarray], who: str) -> None:
        """`restored` must equal the saved state bitwise, on the live sharding."""
        live = jax.tree.leaves(self.state)
        got = jax.tree.leaves(restored)
        assert jax.tree.structure(restored) == jax.tree.structure(self.state), who
        for i, (a, ref, x) in enumerate(zip(got, reference, live, strict=True)):
            assert isinstance(a, jax.Array), (who, i, type(a))
            assert a.sharding.is_equivalent_to(x.sharding, x.ndim), (who, i, a.sharding)
            assert a.dtype == ref.dtype and np.array_equal(np.asarray(a), ref), (who, i)


# ---------------------------------------------------------------------- peers


def kubeckpt_env(root: Path, local_dir: Path | None = None) -> dict[str, str]:
    """What the webhook injects (tests/runtime/jax/test_jax_runtime.py `_env`)."""
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": str(10**9),
        "CHECKPOINT_MAX_CHECKPOINTS": "1",
        "CHECKPOINT_JIT": "false",
        "CHECKPOINT_CONTROL_DIR": str(root / "control"),
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        "KUBECKPT_STAGING_DIR": str(root / "staging"),
    }
    if local_dir is not None:
        env["CHECKPOINT_LOCAL_DIR"] = str(local_dir)
        env["CHECKPOINT_LOCAL_PERIOD"] = str(LOCAL_PERIOD)
    return env


class Peer:
    name = ""
    sync = True
    fsync = ""

    def __init__(self, loop: Loop, root: Path) -> None:
        self.loop = loop
        self.root = root / self.name
        self.root.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self.durable_at: float | None = None
        self.stall_seconds = 0.0  # a stall the peer reports beyond its call

    def start(self) -> None:
        """At a step boundary; returns when training may go on."""
        raise NotImplementedError

    def poll(self) -> float | None:
        """monotonic() at which the checkpoint became durable; None while not yet."""
        return self.durable_at

    def done(self) -> None:
        """After durable: collect the result."""

    def restores(self, reference: list[np.ndarray]) -> dict[str, float]:
        return {}

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass


class Kubeckpt(Peer):
    name = "kubeckpt.sync"
    tier = "persistent"
    fsync = "its data file once at its end, its index, the manifest and their directory"

    snapshot = "auto"
    persistent_format = "auto"

    def __init__(self, loop: Loop, root: Path) -> None:
        super().__init__(loop, root)
        self.mgr = CheckpointManager.from_env(
            environ=self.env(),
            async_save=not self.sync,
            snapshot=self.snapshot,
            persistent_format=self.persistent_format,
        )
        self.result: Any = None
        self.t_save = 0.0

    def env(self) -> dict[str, str]:
        return kubeckpt_env(self.root)

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        self.t_save = time.monotonic()
        self.result = self.mgr.save(self.n, self.loop.state, blocking=self.sync)
        if self.sync:
            self._finish(self.result)

    def _finish(self, result: Any) -> None:
        assert result is not None and result.ok, result
        self.result = result
        self.stall_seconds = result.stall_seconds
        self.durable_at = self.t_save + result.save_seconds

    def poll(self) -> float | None:
        if self.durable_at is None and not self.mgr._ckpt.session.busy:
            self._finish(self.mgr.wait())
        return self.durable_at

    def restore(self, verify: str, tier: str = "persistent") -> tuple[float, Any]:
        mgr = CheckpointManager.from_env(
            environ=self.env(), verify_checksums=verify, persistent_format=self.persistent_format
        )
        target = self.loop.abstract()
        t0 = time.monotonic()
        state, step = mgr.restore(target)
        jax.block_until_ready(state)
        elapsed = time.monotonic() - t0
        assert step == self.saved_step(), (self.name, step, self.saved_step())
        assert mgr.resumed_tier == tier, (self.name, mgr.resumed_tier)
        mgr.close()
        return elapsed, state

    def saved_step(self) -> int:
        return self.n

    def restores(self, reference: list[np.ndarray]) -> dict[str, float]:
        out = {}
        for key, verify in (("restore", "auto"), ("restore (sizes only)", "never")):
            out[key], state = self.restore(verify, self.tier)
            self.loop.check(state, reference, f"{self.name} {key}")
            del state
        return out

    def close(self) -> None:
        self.mgr.close()


class KubeckptAsync(Kubeckpt):
    name, sync = "kubeckpt.async", False


class KubeckptCopy(Kubeckpt):
    name, sync, snapshot = "kubeckpt.copy", False, "copy"


class KubeckptOrbax(Kubeckpt):
    name, sync, persistent_format = "kubeckpt.orbax", False, "orbax"
    fsync = (
        "every file orbax wrote and every directory, after orbax (which leaves most unsynced), "
        "then the directory after the rename; the index and the manifest"
    )


class KubeckptLocal(Kubeckpt):
    name, sync = "kubeckpt.local", False
    fsync = "every file and directory (a no-op on tmpfs: the tier lives in the node's RAM)"
    tier = "local"
    local_root: Path | None = None

    def __init__(self, loop: Loop, root: Path) -> None:
        assert self.local_root is not None
        self.local_dir = self.local_root / "local"
        self.local_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(loop, root)

    def env(self) -> dict[str, str]:
        return kubeckpt_env(self.root, self.local_dir)

    def saved_step(self) -> int:
        return self.n * LOCAL_PERIOD

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        self.t_save = time.monotonic()
        stop = self.mgr.step_end(self.saved_step(), self.loop.state)
        assert not stop
        assert self.mgr._ckpt.session.in_flight, "step_end did not save to the local tier"

    def _finish(self, result: Any) -> None:
        super()._finish(result)
        assert set(result.locations) == {"local"}, result.locations

    def remove(self) -> None:
        super().remove()
        shutil.rmtree(self.local_dir, ignore_errors=True)
        self.local_dir.mkdir(parents=True, exist_ok=True)


class Orbax(Peer):
    name = "orbax.sync"
    fsync = (
        "array data and OCDBT manifests (tensorstore's file_io_sync); not _METADATA, "
        "_CHECKPOINT_METADATA, array_metadatas/process_0, commit_success.txt, nor the parent "
        "directory after the final rename (strace)"
    )

    def __init__(self, loop: Loop, root: Path) -> None:
        super().__init__(loop, root)
        self.mgr = self.manager(enable_async_checkpointing=not self.sync)
        self.waiter: threading.Thread | None = None

    def manager(self, **options: Any) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.root / "ckpt", options=ocp.CheckpointManagerOptions(max_to_keep=1, **options)
        )

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        self.mgr.save(self.n, args=ocp.args.StandardSave(self.loop.state))
        if self.sync:
            self.durable_at = time.monotonic()
            return

        def wait() -> None:
            self.mgr.wait_until_finished()
            self.durable_at = time.monotonic()

        self.waiter = threading.Thread(target=wait, name="orbax-durable", daemon=True)
        self.waiter.start()

    def done(self) -> None:
        if self.waiter is not None:
            self.waiter.join()
            self.waiter = None
        self.mgr.wait_until_finished()
        self.mgr.check_for_errors()
        assert self.mgr.latest_step() == self.n, (self.mgr.all_steps(), self.n)

    def restores(self, reference: list[np.ndarray]) -> dict[str, float]:
        mgr = self.manager(read_only=True)
        target = self.loop.abstract()
        t0 = time.monotonic()
        state = mgr.restore(self.n, args=ocp.args.StandardRestore(target))
        jax.block_until_ready(state)
        elapsed = time.monotonic() - t0
        mgr.close()
        self.loop.check(state, reference, f"{self.name} restore")
        return {"restore": elapsed}

    def remove(self) -> None:
        super().remove()
        self.mgr.reload()  # forget the removed step: max_to_keep would delete it again

    def close(self) -> None:
        self.mgr.close()


class OrbaxAsync(Orbax):
    name, sync = "orbax.async", False


PEERS: list[type[Peer]] = [
    Kubeckpt,
    KubeckptAsync,
    KubeckptCopy,
    KubeckptOrbax,
    KubeckptLocal,
    Orbax,
    OrbaxAsync,
]
GPU_PEERS = "kubeckpt.async,kubeckpt.local,orbax.async"


def device_bytes() -> tuple[int, int] | None:
    """(bytes in use, peak bytes in use) on the first device, where the backend counts them."""
    stats = jax.devices()[0].memory_stats()
    if not stats or "bytes_in_use" not in stats:
        return None
    return stats["bytes_in_use"], stats.get("peak_bytes_in_use", 0)


# ---------------------------------------------------------------------- measuring


def settle() -> None:
    """Let the previous measurement's deletions reach the disk (runtime_checkpoint.settle)."""
    os.sync()
    time.sleep(1)
    os.sync()


def raw_write(path: Path, loop: Loop) -> float:
    """os.write of exactly the state's bytes in 1 MiB pieces, then fsync: the disk's speed."""
    arrays = [np.asarray(x) for x in jax.tree.leaves(loop.state)]
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for arr in arrays:
        view = memoryview(arr.reshape(-1).view(np.uint8))
        for start in range(0, len(view), RAW_CHUNK):
            chunk = view[start : start + RAW_CHUNK]
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
    os.fsync(fd)
    os.close(fd)
    elapsed = time.monotonic() - t0
    path.unlink()
    return elapsed


def measure(peer: Peer, loop: Loop, base_steps: int = 3) -> tuple[dict[str, float], list]:
    """One checkpoint inside the training loop; also the state it saved, on the host."""
    before = [loop.step() for _ in range(base_steps)]
    reference = loop.snapshot()
    peer.stall_seconds = 0.0
    mem_before = device_bytes()
    t_save = time.monotonic()
    peer.start()
    call = time.monotonic() - t_save
    mem_after = device_bytes()
    n = 0
    first = 0.0
    while True:
        took = loop.step()
        first = first or took
        n += 1
        durable = peer.poll()
        # A time limit, not a step count: a GPU step takes milliseconds.
        if durable is not None or time.monotonic() - t_save > 120:
            break
    end = time.monotonic()
    durable = peer.poll()
    assert durable is not None, f"{peer.name}: not durable after {n} steps (120 s)"
    peer.done()
    base = statistics.median(before + [loop.step() for _ in range(base_steps)])
    out = {
        "stall": max(call, peer.stall_seconds),
        "durable": durable - t_save,
        "lost": (end - t_save) - n * base,
        "step": base,
        "first step": first,
        "steps": n,
    }
    if mem_before is not None and mem_after is not None:
        # A save that copies the state on the device holds that copy past its call.
        out["device +MiB"] = (mem_after[0] - mem_before[0]) / 2**20
        out["device peak MiB"] = device_bytes()[1] / 2**20  # type: ignore[index]
    if isinstance(peer, Kubeckpt):
        out["persist"] = peer.result.persist_seconds  # the writer: write, fsync, hash, manifest
    return out, reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir on /work)")
    ap.add_argument(
        "--local-dir", default=None, help="the local tier (default: a temp dir on /dev/shm)"
    )
    ap.add_argument("--gib", type=float, default=0.75, help="parameters + Adam state, GiB")
    ap.add_argument(
        "--batch", type=int, default=None, help="rows per step, sets the step time (256; GPU 8192)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="default 3, 2 on a GPU")
    ap.add_argument("--only", default=None, help=f"comma-separated peer names (GPU: {GPU_PEERS})")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = ap.parse_args()
    gpu = args.device == "gpu"
    jax.config.update("jax_platforms", "cuda,cpu" if gpu else "cpu")
    if gpu and jax.devices()[0].platform != "gpu":
        raise SystemExit(f"--device gpu: jax found {jax.devices()[0].platform} only")
    args.rounds = args.rounds or (2 if gpu else 3)
    args.batch = args.batch or (8192 if gpu else 256)
    args.only = GPU_PEERS if args.only is None and gpu else args.only or ""
    base = (
        Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kubeckpt-jax-", dir="/work"))
    )
    base.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm")
    if args.local_dir:
        local_root = Path(args.local_dir)
        local_root.mkdir(parents=True, exist_ok=True)
    elif shm.is_dir() and os.access(shm, os.W_OK):
        local_root = Path(tempfile.mkdtemp(prefix="kubeckpt-jax-local-", dir=shm))
    else:
        local_root = Path(tempfile.mkdtemp(prefix="local-", dir=base))
    KubeckptLocal.local_root = local_root
    try:
        run(args, base, local_root)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
        if not args.local_dir:
            shutil.rmtree(local_root, ignore_errors=True)


def run(args: argparse.Namespace, base: Path, local_root: Path) -> None:
    loop = Loop(args.gib, args.batch)
    state_bytes = loop.nbytes
    import trainer_runtime

    print(
        f"jax {jax.__version__}, orbax-checkpoint {ocp.__version__}, {os.cpu_count()} CPUs, "
        f"device {jax.devices()[0].platform}; state {state_bytes / 1024**3:.2f} GiB "
        f"({state_bytes / 1e9:.2f} GB: {loop.layers} x Linear({WIDTH}, {WIDTH}) + Adam mu, nu; "
        f"{len(jax.tree.leaves(loop.state))} arrays), batch {args.batch}; in {base}, local tier "
        f"in {local_root}; trainer_runtime from {Path(trainer_runtime.__file__).parent}",
        flush=True,
    )
    kinds = [p for p in PEERS if not args.only or p.name in args.only.split(",")]
    peers: list[Peer] = []
    for kind in kinds:
        peer = kind(loop, base)
        settle()
        _, reference = measure(peer, loop, base_steps=1)  # untimed: compiles, threads, caches
        peer.restores(reference)
        del reference
        peer.remove()
        peers.append(peer)
    results: dict[str, dict[str, list[float]]] = {p.name: {} for p in peers}
    raw: list[float] = []
    for rnd in range(args.rounds):
        settle()
        raw.append(state_bytes / raw_write(base / "raw.bin", loop))
        order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
        if rnd % 2:
            order.reverse()
        for peer in order:
            settle()
            m, reference = measure(peer, loop)
            restores = peer.restores(reference)
            del reference
            rows = results[peer.name]
            for key, value in {**m, **restores}.items():
                rows.setdefault(key, []).append(value)
            peer.remove()
            print(
                f"round {rnd + 1} {peer.name:15s} stall {m['stall']:.3f} s, durable "
                f"{m['durable']:.2f} s, lost {m['lost']:.2f} s over {m['steps']} steps of "
                f"{m['step']:.3f} s" + "".join(f", {k} {v:.3f} s" for k, v in restores.items()),
                flush=True,
            )
    for peer in peers:
        peer.close()

    print(f"\n== {args.rounds} rounds: median [min-max], seconds ==")
    print(f"disk: write (1 MiB pieces) + fsync of the state's bytes {spread(raw_gb(raw))} GB/s")
    keys = ["stall", "durable", "lost", "steps", "first step", "step", "restore"]
    keys.append("restore (sizes only)")
    if any("device +MiB" in rows for rows in results.values()):
        keys += ["device +MiB", "device peak MiB"]
    print(f"{'peer':15s} " + " | ".join(keys))
    for peer in peers:
        rows = results[peer.name]
        digits = {"steps": 0, "device +MiB": 0, "device peak MiB": 0}
        cells = [spread(rows[k], digits.get(k, 3)) if k in rows else "-" for k in keys]
        print(f"{peer.name:15s} " + " | ".join(cells))
    print(
        "steps: steps run until durable (the last one ends after it); first step: the step "
        "right after the save call; step: the undisturbed step (median of 3 before, 3 after)"
    )
    print(
        "restore: into the live sharding from an abstract state, on a fresh manager; kubeckpt's "
        "'restore' verifies the XXH3 checksum of every file (the default), 'sizes only' is "
        "KUBECKPT_VERIFY_CHECKSUMS=never; kubeckpt.sync, .async and .copy restore from the "
        "persistent tier in kubeckpt's per-process format, kubeckpt.orbax from it in orbax's, "
        "kubeckpt.local from the local tier; one process; every restore equal bitwise to the "
        "state saved"
    )
    if "device +MiB" in keys:
        print(
            f"device +MiB: the device's bytes in use right after the save call minus just before "
            f"it (a copy of the state on the device would be +{state_bytes / 2**20:.0f}); "
            f"device peak MiB: peak_bytes_in_use after the measurement (cumulative)"
        )
    for peer in peers:
        print(f"fsync by {peer.name}: {peer.fsync}")
    for peer in peers:
        if isinstance(peer, Kubeckpt):
            persist = results[peer.name]["persist"]
            print(
                f"{peer.name}: writer thread {spread(persist)} s = "
                f"{spread(raw_gb([state_bytes / p for p in persist]))} GB/s of state"
            )

    def compare(key: str, a: str, b: str) -> None:
        if a in results and b in results and key in results[a] and key in results[b]:
            x, y = results[a][key], results[b][key]
            print(f"  {key}: {a} {spread(x)} / {b} {spread(y)}: {ratio(x, y)}")

    print("ratios of medians (only where the ranges do not overlap):")
    for key in ("stall", "durable", "lost"):
        compare(key, "kubeckpt.sync", "orbax.sync")
        compare(key, "kubeckpt.async", "orbax.async")
        compare(key, "kubeckpt.copy", "orbax.async")
        compare(key, "kubeckpt.orbax", "orbax.async")
        compare(key, "kubeckpt.copy", "kubeckpt.async")
        compare(key, "kubeckpt.local", "orbax.async")
        compare(key, "kubeckpt.local", "kubeckpt.async")
    for name in ("kubeckpt", "orbax"):
        compare("stall", f"{name}.async", f"{name}.sync")
        compare("lost", f"{name}.async", f"{name}.sync")
    compare("restore", "kubeckpt.async", "orbax.async")
    compare("restore", "kubeckpt.orbax", "orbax.async")
    compare("restore (sizes only)", "kubeckpt.async", "orbax.async")
    compare("restore", "kubeckpt.local", "kubeckpt.async")
    compare("restore", "kubeckpt.local", "orbax.async")


def raw_gb(values: list[float]) -> list[float]:
    return [v / 1e9 for v in values]


if __name__ == "__main__":
    main()
