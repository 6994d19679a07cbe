"""Bounded staging benchmark (issue 27 item 3): peak extra host memory of an async torch save
against the state size and the staging budget, and what chunking costs in stall and durable time.

Usage: python hack/bench/runtime_staging.py [--budget-mib 256] [--dir DIR] [--device cpu|cuda]

Each case runs in a fresh subprocess (`--child`), so its peak resident set (VmHWM) is its own:
a model of Adam-trained parameters (state = parameters + exp_avg + exp_avg_sq) takes a few
steps, the peak is reset (/proc/self/clear_refs), then two async saves run inside the training
loop (the first allocates the staging buffers, the second reuses them). "peak extra" is the VmHWM
over those saves minus the resident set before them, "step only" the same for one training step
without a save (Adam's own temporaries, which the save's figure includes: a step runs while the
save is in flight), and "staging" the difference, the save's own; "stall" is how long the
training thread was held (SaveResult.stall_seconds: staging plus the wait in the next optimizer
step), "durable" the time from the snapshot until the checkpoint was committed; both of the
second save.

Cases: states of 0.5x, 1x and 2x the budget, each saved with that budget (chunked where it does
not fit) and without one (staged whole), in the same run. Target: staging / budget <= 1.
With `--limit` (default on), the 2x state is also saved under an address-space limit
(RLIMIT_AS) of the process's size plus the budget plus a slack: the stand-in for a container's
memory limit that needs no root; staged whole it fails to allocate, chunked it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024
TENSOR_MIB = 4  # one parameter tensor: 4 MiB (1 Mi float32)
# Address space beyond the budget a save may need: thread stacks (the writer, hash and warm-up
# threads map 8 MiB each) and allocator arenas, not staging.
LIMIT_SLACK = 160 * MiB


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def child(args: argparse.Namespace) -> dict:
    """One case, in this process: the figures as a dict (printed as JSON)."""
    import torch

    from trainer_runtime.torch import CheckpointManager

    torch.set_num_threads(1)  # no OpenMP team: its threads' stacks would count under RLIMIT_AS
    device = torch.device(args.device)
    count = max(1, round(args.state_mib / 3 / TENSOR_MIB))
    params = torch.nn.ParameterList(
        torch.nn.Parameter(torch.zeros(TENSOR_MIB * MiB // 4, device=device)) for _ in range(count)
    )
    for p in params:
        p.grad = torch.full_like(p, 1e-3)  # allocated once: a step allocates nothing more
    # foreach=False: Adam's per-step temporaries are one tensor's size, not the whole state's,
    # so the peak over a save is the save's own.
    optimizer = torch.optim.Adam(params.parameters(), lr=1e-4, foreach=False)
    optimizer.step()  # Adam's state exists from here
    state_bytes = sum(p.numel() * p.element_size() * 3 for p in params)
    root = Path(args.dir)
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "1000000",  # saves only when asked
        "CHECKPOINT_MAX_CHECKPOINTS": "1",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        "KUBECKPT_STAGING_BUDGET_BYTES": str(args.budget_bytes),
    }
    # One save of a tiny state first, elsewhere: the save path's lazy imports, threads and
    # allocator arenas are the process's, not staging's, and stay out of the figure.
    tiny = torch.nn.Linear(4, 4)
    warm_env = {**env, "CHECKPOINT_URI": str(root / "warm"), "KUBECKPT_STAGING_BUDGET_BYTES": "0"}
    warm = CheckpointManager.from_env(tiny, torch.optim.Adam(tiny.parameters()), environ=warm_env)
    warm.save(1, blocking=False)
    warm.wait()
    warm.save(2, blocking=True)
    warm.close()
    mgr = CheckpointManager.from_env(params, optimizer, environ=env)
    for _ in range(3):
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if args.limit_bytes:
        vm = _status_kib("VmSize") * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + args.limit_bytes, vm + args.limit_bytes))
    rss = _status_kib("VmRSS") * 1024
    _reset_peak()
    results = []
    error = None
    try:
        for step in (10, 20):
            mgr.save(step, blocking=False)
            optimizer.step()  # waits for the copies the save still reads (the stall)
            result = mgr.wait()
            assert result is not None
            if not result.ok:
                error = result.error
                break
            results.append(result)
    except (RuntimeError, MemoryError) as e:  # staging could not allocate under the limit
        error = f"{type(e).__name__}: {e}"
    peak = _status_kib("VmHWM") * 1024
    _reset_peak()
    rss_after = _status_kib("VmRSS") * 1024
    optimizer.step()  # the control: a training step without a save
    step_extra = _status_kib("VmHWM") * 1024 - rss_after
    mgr.close()
    last = results[-1] if results else None
    return {
        "state_bytes": state_bytes,
        "budget_bytes": args.budget_bytes,
        "peak_extra_bytes": peak - rss,
        "step_extra_bytes": step_extra,
        "saves_ok": len(results),
        "error": error,
        "stall_s": last.stall_seconds if last else None,
        "durable_s": last.save_seconds if last else None,
    }


def run_case(
    state_mib: int, budget_bytes: int, device: str, base: Path, limit_bytes: int = 0
) -> dict:
    with tempfile.TemporaryDirectory(dir=base) as d:
        argv = [
            sys.executable,
            __file__,
            "--child",
            f"--state-mib={state_mib}",
            f"--budget-bytes={budget_bytes}",
            f"--limit-bytes={limit_bytes}",
            f"--device={device}",
            f"--dir={d}",
        ]
        # A fixed mmap threshold: glibc otherwise raises it after the first free of a large
        # block, and Adam's per-step temporaries then stay in the heap, tens of MiB that would
        # blur the figure from one case to the next. One malloc arena under the limit: each
        # thread's own arena reserves 64 MiB of address space, which RLIMIT_AS would count.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(256 * 1024)}
        if limit_bytes:
            env["MALLOC_ARENA_MAX"] = "1"
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=600, check=False, env=env
        )
    if proc.returncode != 0:
        if limit_bytes:  # under the limit, a crash (no thread, no memory) is the finding
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return {"saves_ok": 0, "error": f"rc {proc.returncode}: {last}", "peak_extra_bytes": 0}
        raise SystemExit(f"case failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--no-limit", action="store_true", help="skip the RLIMIT_AS case")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-mib", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--limit-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    base = Path(args.dir or tempfile.gettempdir())
    budget = args.budget_mib * MiB
    unbounded = 1 << 50
    print(f"budget {args.budget_mib} MiB, device {args.device}, checkpoints under {base}")
    header = (
        f"{'state':>9} {'x budget':>8} {'mode':>7} {'peak extra':>11} {'step only':>9} "
        f"{'staging':>9} {'÷ budget':>8} {'stall s':>8} {'durable s':>9}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for factor in (0.5, 1.0, 2.0):
        state_mib = int(args.budget_mib * factor)
        for mode, b in (("budget", budget), ("whole", unbounded)):
            t0 = time.monotonic()
            r = run_case(state_mib, b, args.device, base)
            r.update(mode=mode, factor=factor, wall_s=time.monotonic() - t0)
            rows.append(r)
            staging = r["peak_extra_bytes"] - max(0, r["step_extra_bytes"])
            print(
                f"{r['state_bytes'] / MiB:>5.0f} MiB {factor:>8.1f} {mode:>7} "
                f"{r['peak_extra_bytes'] / MiB:>7.0f} MiB {r['step_extra_bytes'] / MiB:>5.0f} MiB "
                f"{staging / MiB:>5.0f} MiB {staging / budget:>8.2f} "
                f"{r['stall_s']:>8.3f} {r['durable_s']:>9.3f}"
                + (f"  error: {r['error']}" if r["error"] else "")
            )
    if not args.no_limit:
        print(f"\nstate 2x the budget under RLIMIT_AS = size + budget + {LIMIT_SLACK // MiB} MiB:")
        for mode, b in (("budget", budget), ("whole", unbounded)):
            r = run_case(2 * args.budget_mib, b, args.device, base, budget + LIMIT_SLACK)
            ok = r["saves_ok"] == 2 and not r["error"]
            why = f" ({r['error']})" if r["error"] else ""
            print(
                f"  {mode:>6}: {'saved' if ok else 'FAILED'}, peak extra "
                f"{r['peak_extra_bytes'] / MiB:.0f} MiB{why}"
            )
            rows.append({**r, "mode": f"{mode}+rlimit", "factor": 2.0})
    if os.environ.get("RUNTIME_STAGING_JSON"):
        Path(os.environ["RUNTIME_STAGING_JSON"]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
