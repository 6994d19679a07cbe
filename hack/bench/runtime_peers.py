"""trainer_runtime side by side with torch.save and torch.distributed.checkpoint (issues 17, 27).

Usage: PYTHONPATH=. python hack/bench/runtime_peers.py [--dir DIR] [--gib 1.1] [--rounds 3]
       [--only NAME,NAME] [--nice 0,5] [--device cpu|cuda] [--batch 8]

Every method runs in its own subprocess (no state, thread, page cache or process group carried
from one to the next), on the same >= 1 GiB model + Adam state (runtime_checkpoint.build) and the
same disk. Inside it: one untimed checkpoint (staging buffers, processes), then `--rounds` rounds
of: a raw write+fsync of the same bytes, one checkpoint inside the training loop, its restores.

  torch.save      torch.save(state_dict) + flush + fsync                 (sync)
  dcp.save        dcp.save, FileSystemWriter                             (sync)
  dcp.async       dcp.async_save, thread executor, one DefaultStager reused across saves
                  (staging cached: buffers allocated once; blocking copy, pinned on CUDA)
                  and one FileSystemWriter reused                        (async)
  dcp.async+ds    the same with DefaultStager's async staging (shared memory on CPU; pinned +
                  non-blocking on CUDA); the next optimizer.step() waits for staging, as
                  torchtitan does                                        (async)
  dcp.async+proc  the same with the process executor; it needs a default process group, so its
                  subprocess (only) creates a world-1 gloo group         (async)
  kubeckpt.sync   CheckpointManager.save(), KUBECKPT_ASYNC_SAVE=false     (sync)
  kubeckpt.async  CheckpointManager.save(blocking=False) in the loop      (async)
  kubeckpt.buffered  the same with O_DIRECT off: written through the page cache (async)

Writer priority: each async method runs once per value of --nice (default 0 and 5): kubeckpt's
writer thread at that nice (fsutil.WRITER_NICE; 5 is the runtime's default), DCP's writer thread
(set in the storage writer when the executor thread starts it), DefaultStager's staging thread,
and every thread of the process executor's checkpoint process at the same value. Sync methods
write on the training thread (nothing to yield to) and run once at nice 0.

For each: the training stall (the save call, plus any wait before the next optimizer step), the
time until durable (every method fsyncs), the training time lost per checkpoint (from the save
call to the end of the first step that ends after the checkpoint is durable, minus that many steps
at the undisturbed step time), CPU seconds per checkpoint beyond training (getrusage SELF +
CHILDREN plus live child processes from /proc, over the same window, minus that many undisturbed
steps' CPU), and restore into the live model and optimizer (kubeckpt with every file's checksum
verified, the default; dcp.load; torch.load(mmap=True)) from the page cache (every file read
once first: kubeckpt writes around the page cache) and cold (the checkpoint's files evicted
with posix_fadvise DONTNEED), next to a raw read of the same files,
also cold. Last, a corruption check: one byte flipped in the middle of the largest file of a
fresh checkpoint, then a restore: refused, or loaded (state equal or not to what was saved).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
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
from benchstats import spread, target
from runtime_checkpoint import build, evict, manager, raw_read, settle
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer_runtime import fsutil
from trainer_runtime.torch import plain

warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
RAW_CHUNK = 1024 * 1024  # the write size that costs least kernel CPU here (plain.CHUNK)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """CPU time of this process, its reaped children and its live descendants (the process
    executor's checkpoint process lives across saves: getrusage(CHILDREN) never sees it)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    for pid in descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        except (OSError, IndexError, ValueError):
            pass  # exited meanwhile
    return total


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            kids = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out


def renice_process(pid: int, nice: int) -> None:
    """Every thread of process `pid` at `nice` (Linux applies a nice value per thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
        except OSError:
            pass


class Loop:
    """The training loop: one step = forward, backward, [wait hook], optimizer.step()."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: int) -> None:
        self.model = model
        self.optimizer = optimizer
        self.batch = batch
        self.device = next(model.parameters()).device
        self.before_update: Callable[[], None] | None = None
        self.waited = 0.0  # time spent in before_update

    def step(self) -> float:
        t0 = time.monotonic()
        self.optimizer.zero_grad(set_to_none=True)
        x = torch.randn(self.batch, 4096, device=self.device)
        self.model(x).square().mean().backward()
        if self.before_update is not None:
            w = time.monotonic()
            self.before_update()
            self.waited += time.monotonic() - w
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.monotonic() - t0

    def tensors(self) -> list[torch.Tensor]:
        out = [p.detach() for p in self.model.parameters()]
        return out + [t for s in self.optimizer.state.values() for t in s.values() if t.numel() > 1]


def state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, [optimizer])
    return {"model": msd, "optim": osd}


class Peer:
    name = ""
    sync = True
    checksum = ""
    restores = True  # False where another method's restore reads the same format

    def __init__(self, loop: Loop, root: Path, nice: int) -> None:
        self.loop = loop
        self.root = root / self.name
        self.root.mkdir(parents=True, exist_ok=True)
        self.nice = nice
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

    def after_warmup(self) -> None:
        """After the untimed first checkpoint: threads and processes now exist."""

    def path(self) -> Path:
        return self.root / f"ckpt-{self.n}"

    def files(self) -> list[Path]:
        """The current checkpoint's files."""
        p = self.path()
        return [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())

    def restore(self) -> float:
        raise NotImplementedError

    def load_flipped(self) -> str:
        """Restore a checkpoint with one flipped byte; what happened, in words."""
        self.restore()
        return "loaded"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass


class TorchSave(Peer):
    name, checksum = "torch.save", "zip CRC-32 per record"

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
        sd = torch.load(self.path(), map_location=self.loop.device, weights_only=True, mmap=True)
        self.loop.model.load_state_dict(sd["model"])  # copies into the parameters
        # Optimizer.load_state_dict would keep the loaded tensors, still file mappings not yet
        # read: copy them into the live state (as dcp.load and kubeckpt do), then load that.
        live = self.loop.optimizer.state_dict()["state"]
        for idx, st in sd["optim"]["state"].items():
            for key, value in st.items():
                if torch.is_tensor(value) and value.numel() > 1:
                    st[key] = live[idx][key].copy_(value)
        self.loop.optimizer.load_state_dict(sd["optim"])
        return time.monotonic() - t0


class NicedWriter(dcp.FileSystemWriter):
    """DCP's FileSystemWriter whose writing thread takes the benchmark's writer priority. DCP
    calls set_up_storage_writer on the thread that then plans and writes (the executor's)."""

    nice = 0

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> None:
        if self.nice:
            fsutil.lower_thread_priority(self.nice)
        return super().set_up_storage_writer(*args, **kwargs)


class DcpSave(Peer):
    name, checksum = "dcp.save", "zip CRC-32 per tensor (torch.save format)"

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


class DcpAsync(DcpSave):
    """dcp.async_save with one stager (its staged copy cached: StateDictStager keeps the CPU
    storages of the live ones) and one storage writer, both reused across saves."""

    name, sync, restores = "dcp.async", False, False
    async_staging = False
    process = False
    executor: Any = None

    def __init__(self, loop: Loop, root: Path, nice: int) -> None:
        super().__init__(loop, root, nice)
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = loop.device.type == "cuda"
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                # Shared memory where a checkpoint process reads the copy (and on CPU, as
                # torchtitan configures it); on CUDA the thread executor needs only pinned memory.
                use_shared_memory=self.async_staging and (not cuda or self.process),
                use_async_staging=self.async_staging,
                use_non_blocking_copy=cuda and self.async_staging,
            )
        )
        pool = getattr(self.stager, "_staging_executor", None)
        if pool is not None and nice:  # the staging thread (one worker, reused) at `nice` too
            pool.submit(fsutil.lower_thread_priority, nice).result()
        self.writer = NicedWriter(str(self.path()))
        self.writer.nice = nice

    def start(self) -> None:
        self.n += 1
        self.durable_at = None
        kwargs: dict[str, Any] = {"async_stager": self.stager}
        if self.executor is not None:
            kwargs["async_checkpointer_type"] = self.executor
        out = dcp.async_save(
            state(self.loop.model, self.loop.optimizer),
            checkpoint_id=str(self.path()),
            storage_writer=self.writer,
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

    def close(self) -> None:
        self.stager.close()


class DcpAsyncStager(DcpAsync):
    name, async_staging = "dcp.async+ds", True


class DcpAsyncProcess(DcpAsyncStager):
    name, process = "dcp.async+proc", True

    def __init__(self, loop: Loop, root: Path, nice: int) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        # The process executor takes its rendezvous from the default group; this subprocess is
        # the only one with a group (every other method runs without one).
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        super().__init__(loop, root, nice)
        self.executor = AsyncCheckpointerType.PROCESS

    def after_warmup(self) -> None:
        if self.nice:
            for pid in descendants(os.getpid()):
                renice_process(pid, self.nice)

    def close(self) -> None:
        super().close()
        dist.destroy_process_group()


class Kubeckpt(Peer):
    name, checksum, restores = "kubeckpt.sync", "xxh3_128 per file (manifest)", False

    def __init__(self, loop: Loop, root: Path, nice: int) -> None:
        super().__init__(loop, root, nice)
        fsutil.WRITER_NICE = nice
        self.mgr = manager(loop.model, loop.optimizer, self.root, async_save=not self.sync)
        self.result: Any = None

    def path(self) -> Path:
        return self.root / "persistent" / f"checkpoint-{self.n}"

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

    def _restore(self, verify: str) -> tuple[int, float]:
        mgr = manager(self.loop.model, self.loop.optimizer, self.root, verify_checksums=verify)
        t0 = time.monotonic()
        try:
            step = mgr.restore()
        finally:
            elapsed = time.monotonic() - t0
            mgr.close()
        return step, elapsed

    def restore(self, verify: str = "auto") -> float:
        step, elapsed = self._restore(verify)
        assert step == self.n, (step, self.n)
        return elapsed

    def load_flipped(self) -> str:
        # Its only checkpoint does not verify: since issue 27 the runtime refuses to start from
        # step 0 (ResumeRefused, a SystemExit with the exit code 65) unless the policy says so.
        try:
            step, _ = self._restore("auto")
        except SystemExit as e:
            return f"refused (exit {e.code}: no checkpoint verifies)"
        return "loaded" if step == self.n else f"skipped (restore returned step {step})"

    def verify_pass(self) -> float:
        """The content check alone, every file hashed from the page cache: what a restore that
        checks before loading adds (StartFresh, DCP); the default one hashes the shards as it
        loads them, so its time is close to the restore with sizes only."""
        from trainer_runtime import layout

        t0 = time.monotonic()
        _, problems = layout.verify_checkpoint(self.path(), checksums=True)
        elapsed = time.monotonic() - t0
        assert not problems, problems
        return elapsed

    def close(self) -> None:
        self.mgr.close()


class KubeckptAsync(Kubeckpt):
    name, sync, restores = "kubeckpt.async", False, True


class KubeckptBuffered(KubeckptAsync):
    """kubeckpt.async with O_DIRECT switched off in its process: its files are written through
    the page cache (1 MiB pieces, writeback started after each), as before the direct writes,
    so the same run shows what writing around the page cache changes."""

    name = "kubeckpt.buffered"

    def __init__(self, loop: Loop, root: Path, nice: int) -> None:
        from trainer_runtime import direct_write

        setattr(direct_write, "_O_DIRECT", 0)  # noqa: B010 (a Final, changed in this process)
        super().__init__(loop, root, nice)


PEERS: list[type[Peer]] = [
    TorchSave,
    DcpSave,
    DcpAsync,
    DcpAsyncStager,
    DcpAsyncProcess,
    Kubeckpt,
    KubeckptAsync,
    KubeckptBuffered,
]
PEER_BY_NAME = {p.name: p for p in PEERS}
VERIFY_THREADS = min(8, max(2, os.cpu_count() or 2))  # layout.verify_checkpoint's default


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
            if writeback:
                fsutil.start_writeback(fd, offset + start, RAW_CHUNK)
        offset += len(view)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.monotonic() - t0
    path.unlink()
    return elapsed


def measure(peer: Peer, loop: Loop, base_steps: int = 3) -> dict[str, float]:
    """One checkpoint inside the training loop. The undisturbed step time (and CPU) is the
    median of `base_steps` steps before the save and as many after it is durable (other work on
    a shared VM drifts within minutes)."""

    def timed_step() -> tuple[float, float]:
        c = cpu_seconds()
        return loop.step(), cpu_seconds() - c

    before = [timed_step() for _ in range(base_steps)]
    loop.waited = 0.0
    cpu0 = cpu_seconds()
    t_save = time.monotonic()
    peer.start()
    call = time.monotonic() - t_save
    n = 0
    while True:
        loop.step()
        n += 1
        durable = peer.poll()
        if durable is not None or time.monotonic() - t_save > 300:
            break
    end = time.monotonic()
    cpu = cpu_seconds() - cpu0
    peer.done()
    durable = peer.poll()
    assert durable is not None, f"{peer.name}: not durable after {n} steps"
    waited = loop.waited
    base = before + [timed_step() for _ in range(base_steps)]
    step_s = statistics.median(b[0] for b in base)
    step_cpu = statistics.median(b[1] for b in base)
    out = {
        "stall": call + waited,
        "durable": durable - t_save,
        "lost": (end - t_save) - n * step_s,
        "cpu": cpu - n * step_cpu,
    }
    if isinstance(peer, Kubeckpt) and peer.result is not None:
        out["stall"] = max(out["stall"], peer.result.stall_seconds)  # with its pre-step hook
        out["persist"] = peer.result.persist_seconds  # the writer: write, fsync, hash, manifest
    return {**out, "step": step_s, "steps": n}


def with_cpu(fn: Callable[[], float]) -> tuple[float, float]:
    c = cpu_seconds()
    return fn(), cpu_seconds() - c


def corruption_check(peer: Peer, loop: Loop) -> str:
    """A fresh checkpoint of the live state (no step in between), one byte flipped in the middle
    of its largest file, the live state changed, then a restore: refused, or loaded with the
    saved state or not."""
    peer.start()
    while peer.poll() is None:
        time.sleep(0.05)
    peer.done()
    saved = [t.clone() for t in loop.tensors()]
    target_file = max(peer.files(), key=lambda f: f.stat().st_size)
    offset = target_file.stat().st_size // 2
    with open(target_file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))
    with torch.no_grad():
        for t in loop.tensors():
            t.add_(1.0)
    where = f"{target_file.name} byte {offset}"
    try:
        outcome = peer.load_flipped()
    except Exception as e:
        return f"refused ({type(e).__name__}), {where}"
    if outcome != "loaded":
        return f"{outcome}, {where}"
    same = all(torch.equal(a, b) for a, b in zip(loop.tensors(), saved, strict=True))
    return f"loaded silently, state {'equal to' if same else 'DIFFERENT from'} saved, {where}"


def worker(args: argparse.Namespace, kind: type[Peer]) -> dict[str, Any]:
    base = Path(args.dir)
    model, optimizer, state_bytes = build(args.gib, args.device)
    loop = Loop(model, optimizer, args.batch)
    tensors = [t.cpu() for t in loop.tensors()]  # raw writes: the same bytes, from host memory
    peer = kind(loop, base, args.nice)
    settle()
    measure(peer, loop, base_steps=1)  # untimed: buffers, processes, page cache
    peer.after_warmup()
    peer.remove()
    rows: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        settle()
        label = "raw" if rnd % 2 == 0 else "raw+writeback"
        rows.setdefault(label, []).append(
            state_bytes / raw_write(base / "raw.bin", tensors, label != "raw")
        )
        settle()
        m = measure(peer, loop)
        out: dict[str, float] = dict(m)
        if peer.restores:
            files = peer.files()
            # "From the page cache" for every method alike: kubeckpt writes around it
            # (O_DIRECT), the others leave what they wrote there.
            raw_read(files)
            out["restore"], out["restore cpu"] = with_cpu(peer.restore)
            if isinstance(peer, Kubeckpt):
                out["restore(sizes only)"] = peer.restore("never")
                out["verify pass"] = peer.verify_pass()
            evict(files)
            out["raw read(cold)"] = raw_read(files)
            evict(files)
            out["restore(cold)"], out["restore(cold) cpu"] = with_cpu(peer.restore)
        for key, value in out.items():
            rows.setdefault(key, []).append(value)
        peer.remove()
        print(
            f"  round {rnd + 1} {peer.name}@nice{args.nice}: "
            + ", ".join(f"{k} {v:.3f}" for k, v in out.items()),
            flush=True,
        )
    corrupt = corruption_check(peer, loop)
    peer.remove()
    peer.close()
    return {"rows": rows, "corrupt": corrupt, "state_bytes": state_bytes}


def variants(args: argparse.Namespace) -> list[tuple[type[Peer], int]]:
    """What to run, in order: --only's order where given (NAME or NAME@NICE), else PEERS'."""
    nices = [int(n) for n in args.nice.split(",")]
    out: list[tuple[type[Peer], int]] = []
    for token in args.only.split(",") if args.only else [p.name for p in PEERS]:
        name, _, nice = token.partition("@")
        kind = PEER_BY_NAME[name]
        if nice:
            out.append((kind, int(nice)))
        else:
            out += [(kind, 0)] if kind.sync else [(kind, n) for n in nices]
    return out


def label(name: str, nice: int) -> str:
    return f"{name}@{nice}"


def report(args: argparse.Namespace, res: dict[str, dict[str, Any]]) -> None:
    rows = {k: v["rows"] for k, v in res.items()}
    state_bytes = next(iter(res.values()))["state_bytes"]
    print("\n== each method in its own process: median [min-max] over its rounds ==")
    print(f"state {state_bytes / 1024**3:.2f} GiB; times in s, CPU in CPU-s")
    for key in ("raw", "raw+writeback"):
        vals = [v for r in rows.values() for v in r.get(key, [])]
        if vals:
            print(f"disk {key}: write+fsync {spread([v / 1e9 for v in vals], 2)} GB/s (all runs)")
    keys = ["stall", "durable", "lost", "cpu", "restore", "restore cpu", "restore(cold)"]
    keys += ["raw read(cold)", "restore(sizes only)", "verify pass"]
    print("method@nice | rounds | " + " | ".join(keys))
    for name, r in rows.items():
        cells = [spread(r[k]) if k in r else "-" for k in keys]
        print(f"{name} | {len(r['stall'])} | " + " | ".join(cells))
    print(
        f"kubeckpt restore: {plain.READ_THREADS} read threads, verify on {VERIFY_THREADS} threads"
    )
    for name, v in res.items():
        print(f"one flipped byte, {name}: {v['corrupt']}")

    print("\n== targets (median ratios; 'ranges apart' when min-max do not overlap) ==")
    for nice in sorted({int(n) for n in args.nice.split(",")}):
        ours = rows.get(label(KubeckptAsync.name, nice))
        peers = {
            n: r for n, r in rows.items() if n.endswith(f"@{nice}") and not n.startswith("kube")
        }
        peers = {n: r for n, r in peers.items() if not PEER_BY_NAME[n.split("@")[0]].sync}
        if ours is None or not peers:
            continue
        print(f"writers at nice {nice}:")
        for key, limit in (("stall", 0.1), ("lost", 0.5)):
            best = min(peers, key=lambda n, k=key: statistics.median(peers[n][k]))
            print(
                f"  {key}: kubeckpt {spread(ours[key])} vs best peer {best} "
                f"{spread(peers[best][key])}: "
                + target(ours[key], peers[best][key], limit, at_most=True)
            )
        dcpa = peers.get(label(DcpAsync.name, nice))
        if dcpa:
            print(
                f"  durable: kubeckpt {spread(ours['durable'])} vs dcp.async "
                f"{spread(dcpa['durable'])}: "
                + target(ours["durable"], dcpa["durable"], 0.8, at_most=True)
            )
        ocpu = statistics.median(ours["cpu"])
        print(
            f"  CPU per checkpoint: kubeckpt {ocpu:.2f}; "
            + ", ".join(f"{n} {statistics.median(r['cpu']):.2f}" for n, r in peers.items())
        )
        buffered = rows.get(label(KubeckptBuffered.name, nice))
        if buffered:
            for key in ("cpu", "lost", "durable"):
                print(
                    f"  {key}, written around the page cache / through it: {spread(ours[key])}"
                    f" / {spread(buffered[key])} = "
                    f"{statistics.median(ours[key]) / statistics.median(buffered[key]):.2f}x"
                )
        if "persist" in ours:
            raw = [v for r in rows.values() for v in r.get("raw", [])]
            thr = [state_bytes / d for d in ours["persist"]]
            print(
                f"  kubeckpt writer thread: {spread([t / 1e9 for t in thr], 2)} GB/s = "
                f"{100 * statistics.median(thr) / statistics.median(raw):.0f}% of the raw "
                "write+fsync (medians)"
            )
    sync_peers = {n: r for n, r in rows.items() if n.split("@")[0] in ("torch.save", "dcp.save")}
    ks = rows.get(label(Kubeckpt.name, 0))
    if ks and sync_peers:
        best = min(sync_peers, key=lambda n: statistics.median(sync_peers[n]["durable"]))
        theirs = sync_peers[best]["durable"]
        print(
            f"sync save: kubeckpt {spread(ks['durable'])} vs {best} {spread(theirs)}: "
            f"{statistics.median(ks['durable']) / statistics.median(theirs):.2f}x"
        )
    dl = rows.get(label(DcpSave.name, 0), {}).get("restore")
    for name, r in rows.items():
        if not name.startswith("kubeckpt.") or "restore" not in r:
            continue
        if dl:
            print(
                f"restore verified, {name}: dcp.load {spread(dl)} / kubeckpt {spread(r['restore'])}"
                f" = {target(dl, r['restore'], 4.0, at_most=False)}"
            )
        per_round = [a / b for a, b in zip(r["restore(cold)"], r["raw read(cold)"], strict=True)]
        print(
            f"cold restore, {name}: {spread(r['restore(cold)'])} vs raw read of the same files "
            f"(cold) {spread(r['raw read(cold)'])}: per round {spread(per_round, 2)}x "
            f"(target <= 1.2x: {'met' if statistics.median(per_round) <= 1.2 else 'MISSED'})"
        )
    for name, r in rows.items():
        if "restore(cold)" in r and not name.startswith("kube"):
            per_round = [
                a / b for a, b in zip(r["restore(cold)"], r["raw read(cold)"], strict=True)
            ]
            print(f"cold restore / raw read, {name}: {spread(per_round, 2)}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--dir",
        default=None,
        help="where to write; results stay there and a later run with the same --dir reuses "
        "them (default: a temp dir on /work, removed at the end)",
    )
    ap.add_argument("--gib", type=float, default=1.1, help="model + optimizer state, GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="methods to run, in order: NAME or NAME@NICE, ...")
    ap.add_argument("--nice", default="0,5", help="writer nice values for the async methods")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batch", type=int, default=8, help="training batch (GPU: e.g. 2048)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.nice = int(args.nice)
        out = worker(args, PEER_BY_NAME[args.worker])
        Path(args.json).write_text(json.dumps(out))
        return
    base = (
        Path(args.dir)
        if args.dir
        else Path(tempfile.mkdtemp(prefix="kubeckpt-peers-", dir="/work"))
    )
    base.mkdir(parents=True, exist_ok=True)
    import trainer_runtime

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"device {args.device}; {args.gib} GiB state in {base}; "
        f"trainer_runtime from {Path(trainer_runtime.__file__).parent}",
        flush=True,
    )
    res: dict[str, dict[str, Any]] = {}
    for kind, nice in variants(args):
        name = label(kind.name, nice)
        out = base / f"{kind.name}-{nice}.json"
        if out.exists():  # measured by an earlier run into the same --dir: kept, not rerun
            res[name] = json.loads(out.read_text())
            print(f"{name}: from {out}", flush=True)
            continue
        cmd = [sys.executable, __file__, "--worker", kind.name, "--nice", str(nice),
               "--json", str(out), "--dir", str(base / f"w-{kind.name}-{nice}"),
               "--gib", str(args.gib), "--rounds", str(args.rounds),
               "--device", args.device, "--batch", str(args.batch)]  # fmt: skip
        print(f"{name}:", flush=True)
        rc = subprocess.run(cmd, check=False).returncode
        if rc != 0 or not out.exists():
            print(f"{name}: not measured (exit status {rc})", flush=True)
            continue
        res[name] = json.loads(out.read_text())
    if res:
        report(args, res)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
