"""trainer_runtime side by side with torch.save and torch.distributed.checkpoint (issue 17).

Usage: PYTHONPATH=. python hack/bench/runtime_peers.py [--dir DIR] [--gib 1.1] [--rounds 3]
       [--cold] [--only NAME,NAME]

In one process, on the same >= 1 GiB model + Adam state (runtime_checkpoint.build) and the same
disk, each round runs every peer once, in an order rotated from round to round, with a raw
write+fsync of the same bytes between two peers:

  torch.save      torch.save(state_dict) + flush + fsync                 (sync)
  dcp.save        torch.distributed.checkpoint.save, FileSystemWriter    (sync)
  dcp.async       dcp.async_save, default thread executor; the writer
                  stages (a blocking copy to CPU)                        (async)
  dcp.async+ds    dcp.async_save with DefaultStager (shared memory, async
                  staging); the next optimizer.step() waits for staging,
                  as torchtitan does                                     (async)
  dcp.async+proc  the same with the process executor (a world-1 gloo group
                  is created for it)                                     (async)
  kubeckpt.sync   CheckpointManager.save(), KUBECKPT_ASYNC_SAVE=false     (sync)
  kubeckpt.async  CheckpointManager.save(blocking=False) in the loop      (async)

For each: the training stall (the save call, plus any wait before the next optimizer step), the
time until durable (every peer here fsyncs), the training time lost per checkpoint (from the
save call to the end of the first step that ends after the checkpoint is durable, minus that many
steps at the round's own undisturbed step time), and restore into the live model and optimizer
(kubeckpt with every file's checksum verified, the default; dcp.load; torch.load), from the page
cache and with --cold after dropping it. Every peer has had one untimed checkpoint before round 1
(staging buffers, the checkpoint process). Ratios against the best peer are printed only where
the two ranges (min-max over the rounds) do not overlap.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from benchstats import ratio, spread
from runtime_checkpoint import build, drop_caches, manager, settle
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

try:
    from trainer_runtime.fsutil import start_writeback
except ImportError:  # a tree from before issue 17 (PYTHONPATH=old checkout, for "before" figures)
    start_writeback = None  # type: ignore[assignment]

warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
RAW_CHUNK = 1024 * 1024  # the write size that costs least kernel CPU here (plain.CHUNK)
BATCH = 8


class Loop:
    """The training loop: one step = forward, backward, [wait hook], optimizer.step()."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.before_update: Callable[[], None] | None = None
        self.waited = 0.0  # time spent in before_update

    def step(self) -> float:
        t0 = time.monotonic()
        self.optimizer.zero_grad(set_to_none=True)
        self.model(torch.randn(BATCH, 4096)).square().mean().backward()
        if self.before_update is not None:
            w = time.monotonic()
            self.before_update()
            self.waited += time.monotonic() - w
        self.optimizer.step()
        return time.monotonic() - t0


def state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, [optimizer])
    return {"model": msd, "optim": osd}


class Peer:
    name = ""
    sync = True
    checksum = ""

    def __init__(self, loop: Loop, root: Path) -> None:
        self.loop = loop
        self.root = root / self.name
        self.root.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self.durable_at: float | None = None

    def start(self) -> None:
        """Called at a step boundary; returns when training may go on."""
        raise NotImplementedError

    def poll(self) -> float | None:
        """monotonic() at which the checkpoint became durable, None while not yet."""
        return self.durable_at

    def done(self) -> None:
        """After durable: join what is left, drop the hooks."""

    def path(self) -> Path:
        return self.root / f"ckpt-{self.n}"

    def restore(self) -> float | None:
        return None

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass


class TorchSave(Peer):
    name, checksum = "torch.save", "zip CRC-32 per record, never checked by torch.load"

    def start(self) -> None:
        self.n += 1
        sd = {"model": self.loop.model.state_dict(), "optim": self.loop.optimizer.state_dict()}
        with open(self.path(), "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        self.durable_at = time.monotonic()

    def restore(self) -> float:
        t0 = time.monotonic()
        sd = torch.load(self.path(), map_location="cpu", weights_only=True)
        self.loop.model.load_state_dict(sd["model"])
        self.loop.optimizer.load_state_dict(sd["optim"])
        return time.monotonic() - t0


class DcpSave(Peer):
    name, checksum = "dcp.save", "zip CRC-32 per tensor (torch.save), never checked on load"

    def start(self) -> None:
        self.n += 1
        dcp.save(state(self.loop.model, self.loop.optimizer), checkpoint_id=self.path())
        self.durable_at = time.monotonic()

    def restore(self) -> float:
        t0 = time.monotonic()
        targets = state(self.loop.model, self.loop.optimizer)
        dcp.load(targets, checkpoint_id=self.path())
        set_state_dict(
            self.loop.model,
            [self.loop.optimizer],
            model_state_dict=targets["model"],
            optim_state_dict=targets["optim"],
        )
        return time.monotonic() - t0


class DcpAsync(Peer):
    name, sync, checksum = "dcp.async", False, DcpSave.checksum
    stager: Any = None
    executor: Any = None

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        kwargs: dict[str, Any] = {}
        if self.stager is not None:
            kwargs["async_stager"] = self.stager
        if self.executor is not None:
            kwargs["async_checkpointer_type"] = self.executor
        out = dcp.async_save(
            state(self.loop.model, self.loop.optimizer),
            storage_writer=dcp.FileSystemWriter(str(self.path())),
            **kwargs,
        )
        upload: Future = getattr(out, "upload_completion", out)
        staging: Future | None = getattr(out, "staging_completion", None)
        upload.add_done_callback(self._durable)
        if staging is not None:
            # torchtitan's pattern: the next optimizer step must not change what is being copied.
            self.loop.before_update = staging.result
        self.upload = upload

    def _durable(self, _: Future) -> None:
        self.durable_at = time.monotonic()

    def done(self) -> None:
        self.upload.result()
        self.loop.before_update = None


class DcpAsyncStager(DcpAsync):
    name = "dcp.async+ds"

    def __init__(self, loop: Loop, root: Path) -> None:
        super().__init__(loop, root)
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        # On CPU: shared memory, staged on a background thread (pinned memory needs CUDA).
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=True,
                use_async_staging=True,
                use_non_blocking_copy=False,
            )
        )

    def close(self) -> None:
        self.stager.close()


class DcpAsyncProcess(DcpAsyncStager):
    name = "dcp.async+proc"

    def __init__(self, loop: Loop, root: Path) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        if not dist.is_initialized():
            # The process executor takes its rendezvous from the default group.
            store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        super().__init__(loop, root)
        self.executor = AsyncCheckpointerType.PROCESS

    def close(self) -> None:
        super().close()
        dist.destroy_process_group()


class Kubeckpt(Peer):
    name, checksum = "kubeckpt.sync", "xxh3_128 per file (manifest), verified on restore"

    def __init__(self, loop: Loop, root: Path) -> None:
        super().__init__(loop, root)
        self.mgr = manager(loop.model, loop.optimizer, self.root, async_save=not self.sync)
        self.result: Any = None

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        t0 = time.monotonic()
        self.result = self.mgr.save(self.n, blocking=self.sync)
        if self.sync:
            assert self.result is not None and self.result.ok, self.result
            self.durable_at = t0 + self.result.save_seconds

    def poll(self) -> float | None:
        if self.durable_at is None and not self.mgr._ckpt.session.busy:
            self.result = self.mgr.wait()
            assert self.result is not None and self.result.ok, self.result
            self.durable_at = time.monotonic()
        return self.durable_at

    def restore(self, verify: str = "auto") -> float:
        mgr = manager(self.loop.model, self.loop.optimizer, self.root, verify_checksums=verify)
        t0 = time.monotonic()
        step = mgr.restore()
        elapsed = time.monotonic() - t0
        mgr.close()
        assert step == self.n, (step, self.n)
        return elapsed

    def verify_pass(self) -> float:
        """The content check alone (every file hashed from the page cache), to show how restore
        time splits: loading in place (restore with sizes only) plus this pass."""
        from trainer_runtime import layout

        path = self.root / "persistent" / f"checkpoint-{self.n}"
        t0 = time.monotonic()
        _, problems = layout.verify_checkpoint(path, checksums=True)
        elapsed = time.monotonic() - t0
        assert not problems, problems
        return elapsed

    def close(self) -> None:
        self.mgr.close()


class KubeckptAsync(Kubeckpt):
    name, sync = "kubeckpt.async", False


PEERS: list[type[Peer]] = [
    TorchSave,
    DcpSave,
    DcpAsync,
    DcpAsyncStager,
    DcpAsyncProcess,
    Kubeckpt,
    KubeckptAsync,
]


def raw_write(path: Path, tensors: list[torch.Tensor], writeback: bool) -> float:
    """os.write of exactly the state's bytes in RAW_CHUNK pieces, then fsync; with `writeback`
    the device is told to start on each piece at once (what kubeckpt's writer does)."""
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    offset = 0
    for t in tensors:
        view = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(view), RAW_CHUNK):
            chunk = view[start : start + RAW_CHUNK]
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
            if writeback and start_writeback is not None:
                start_writeback(fd, offset + start, RAW_CHUNK)
        offset += len(view)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.monotonic() - t0
    path.unlink()
    return elapsed


def measure(peer: Peer, loop: Loop, base_steps: int = 3) -> dict[str, float]:
    """One checkpoint inside the training loop. The undisturbed step time is the median of
    `base_steps` steps before the save and as many after it is durable (other work on a shared
    VM drifts within minutes)."""
    before = [loop.step() for _ in range(base_steps)]
    loop.waited = 0.0
    t_save = time.monotonic()
    peer.start()
    call = time.monotonic() - t_save
    n = 0
    while True:
        loop.step()
        n += 1
        durable = peer.poll()
        if durable is not None or n >= 40:
            break
    end = time.monotonic()
    peer.done()
    durable = peer.poll()
    assert durable is not None, f"{peer.name}: not durable after {n} steps"
    waited = loop.waited
    base = statistics.median(before + [loop.step() for _ in range(base_steps)])
    out = {"stall": call + waited, "durable": durable - t_save, "lost": (end - t_save) - n * base}
    if isinstance(peer, Kubeckpt) and peer.result is not None:
        out["stall"] = max(out["stall"], peer.result.stall_seconds)  # with its pre-step hook
        out["persist"] = peer.result.persist_seconds  # the writer: write, fsync, hash, manifest
    return {**out, "step": base, "steps": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir on /work)")
    ap.add_argument("--gib", type=float, default=1.1, help="model + optimizer state, GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also restore after drop_caches")
    ap.add_argument("--only", default="", help="comma-separated peer names")
    ap.add_argument("--writer-nice", type=int, default=None, help="kubeckpt's writer thread nice")
    args = ap.parse_args()
    if args.writer_nice is not None:
        import trainer_runtime.fsutil

        trainer_runtime.fsutil.WRITER_NICE = args.writer_nice
    base = (
        Path(args.dir)
        if args.dir
        else Path(tempfile.mkdtemp(prefix="kubeckpt-peers-", dir="/work"))
    )
    base.mkdir(parents=True, exist_ok=True)
    model, optimizer, state_bytes = build(args.gib)
    loop = Loop(model, optimizer)
    tensors = [p.detach() for p in model.parameters()]
    tensors += [t for s in optimizer.state.values() for t in s.values() if t.numel() > 1]
    import trainer_runtime

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; "
        f"state {state_bytes / 1024**3:.2f} GiB ({state_bytes / 1e9:.2f} GB) in {base}; "
        f"trainer_runtime from {Path(trainer_runtime.__file__).parent}",
        flush=True,
    )
    kinds = [p for p in PEERS if not args.only or p.name in args.only.split(",")]
    peers: list[Peer] = []
    for kind in kinds:
        try:
            peer = kind(loop, base)
            settle()
            measure(peer, loop, base_steps=1)  # untimed: buffers, processes, page cache
            peer.remove()
            peers.append(peer)
        except Exception as e:  # e.g. the process executor where it cannot start
            print(f"{kind.name}: not measured: {type(e).__name__}: {e}", flush=True)
            loop.before_update = None
    results: dict[str, dict[str, list[float]]] = {p.name: {} for p in peers}
    raw: dict[str, list[float]] = {"raw": [], "raw+writeback": []}
    for rnd in range(args.rounds):
        order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
        if rnd % 2:
            order.reverse()
        for i, peer in enumerate(order):
            settle()
            label = "raw" if (i + rnd) % 2 == 0 or start_writeback is None else "raw+writeback"
            raw[label].append(state_bytes / raw_write(base / "raw.bin", tensors, label != "raw"))
            settle()
            m = measure(peer, loop)
            rows = results[peer.name]
            for key, value in m.items():
                rows.setdefault(key, []).append(value)
            restores: dict[str, float | None] = {}
            if isinstance(peer, Kubeckpt):
                if not peer.sync:
                    restores["restore"] = peer.restore("auto")
                    restores["restore(sizes only)"] = peer.restore("never")
                    restores["verify pass"] = peer.verify_pass()
            else:
                restores["restore"] = peer.restore()
            if args.cold and restores.get("restore") is not None and drop_caches():
                restores["restore(cold)"] = (
                    peer.restore("auto") if isinstance(peer, Kubeckpt) else peer.restore()
                )
            for key, value in restores.items():
                if value is not None:
                    rows.setdefault(key, []).append(value)
            peer.remove()
            print(
                f"round {rnd + 1} {peer.name:15s} stall {m['stall']:.3f} s, durable "
                f"{m['durable']:.2f} s, lost {m['lost']:.2f} s over {m['steps']} steps of "
                f"{m['step']:.3f} s"
                + "".join(f", {k} {v:.3f} s" for k, v in restores.items() if v is not None),
                flush=True,
            )
    for peer in peers:
        peer.close()

    print(f"\n== {args.rounds} rounds: median [min-max] ==")
    for label, values in raw.items():
        if values:
            print(f"disk {label}: write+fsync {spread([v / 1e9 for v in values])} GB/s")
    keys = ["stall", "durable", "lost", "restore", "restore(sizes only)", "verify pass"]
    keys.append("restore(cold)")
    print(f"{'peer':15s} " + " | ".join(f"{k} s" for k in keys))
    for peer in peers:
        rows = results[peer.name]
        print(f"{peer.name:15s} " + " | ".join(spread(rows[k]) if k in rows else "-" for k in keys))
    for peer in peers:
        print(f"checksum of {peer.name}: {peer.checksum}")
    ours = [p for p in peers if isinstance(p, Kubeckpt)]
    others = [p for p in peers if not isinstance(p, Kubeckpt)]
    for mine in ours:
        rows = results[mine.name]
        thr = [state_bytes / d for d in rows["persist"]]
        line = f"{mine.name}: persist (writer thread) {spread([t / 1e9 for t in thr])} GB/s"
        for label, values in raw.items():
            if values:
                line += (
                    f"; {100 * statistics.median(thr) / statistics.median(values):.0f}% of "
                    f"{label} (medians), {100 * max(thr) / max(values):.0f}% (bests)"
                )
        print(line)
        for key in ("stall", "durable", "lost", "restore", "restore(cold)"):
            # Sync against sync and async against async; restore against every format.
            pool = [p for p in others if key in results[p.name]]
            if not key.startswith("restore"):
                pool = [p for p in pool if p.sync == mine.sync]
            if key not in rows or not pool:
                continue
            best = min(pool, key=lambda p: statistics.median(results[p.name][key]))
            print(
                f"  {key}: {mine.name} {spread(rows[key])} vs the best peer, {best.name}, "
                f"{spread(results[best.name][key])}: {ratio(rows[key], results[best.name][key])}"
            )
            if key.startswith("restore") and key in results.get(DcpSave.name, {}):
                theirs = results[DcpSave.name][key]
                print(f"  {key}: dcp.load / {mine.name}: {ratio(theirs, rows[key])}")
        if "verify pass" in rows and "restore" in results.get(DcpSave.name, {}):
            # Loading and hashing are both bound by memory bandwidth here: their sum is the
            # floor of a verified restore, whether the hash runs as its own pass or fused.
            parts = [
                a + b for a, b in zip(rows["restore(sizes only)"], rows["verify pass"], strict=True)
            ]
            print(
                f"  restore floor (sizes-only load + verify pass) {spread(parts)} s: "
                f"dcp.load / floor {ratio(results[DcpSave.name]['restore'], parts)}"
            )
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
