"""Everything `make demo` and `make test` need, prepared side by side with progress.

Three jobs run at once, each logging to ~/.cache/kubeckpt/logs/prepare-<job>.log: the Python venv
(`make venv`; for the demo `make venv-demo`, the controller extra only), the Go-built binaries
(hack/build-binaries.sh, itself three lanes) and the real node's images (hack/images/build.sh, as
root only). On a 2-core machine they overlap downloads, package unpacking and compiling, which one
after the other leave the CPU or the network idle.

Progress: a line when a step starts or ends, and every 30 s what is running and about how long is
left. The estimate comes from each step's duration in earlier runs on this machine (kept in
~/.cache/kubeckpt/prepare-times.json), else from a cold run on a 2-core machine (COLD below). The
scripts announce their steps ("step NAME: start" / "done") and, first, which steps they plan to run
("plan: ...", leaving out what is cached), so a warm run says "about 0 min left" at once.

Runs on the system Python (the venv is one of the jobs): standard library only.
Usage: python3 hack/prepare.py --for demo|demo-kueue|all
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KUBECKPT_CACHE") or Path.home() / ".cache" / "kubeckpt")
TIMES = CACHE / "prepare-times.json"
HEARTBEAT = 30.0
MIN_MEASURED = 5.0  # shorter: a cached step, which says nothing about a build's time

# Seconds each step took in a cold run on a 2-core machine with the jobs side by side
# (docs/benchmarks.md, "First run"); steps not named here count 60 s.
COLD = {
    "python_packages": 300,
    "kubernetes": 600,
    "kubernetes_node": 240,
    "kubectl": 100,
    "etcd": 120,
    "kwok": 150,
    "training_operator": 180,
    "coredns": 200,
    "jobset": 90,
    "trainer": 90,
    "kueue": 300,
    "prometheus": 240,
    "seaweedfs": 420,  # not measured quiet: 14 min of CPU, so about 7 min on two free cores
    "node_packages": 60,
    "test_packages": 10,
    "image_tools": 40,
    "base": 90,
    "pause": 5,
    "init": 30,
    "controller": 60,
    "runtime": 10,
    "training": 300,
    "node_images": 110,
}

STEP = re.compile(r"step (\w+): (start|done|FAILED)")
PLAN = re.compile(r"plan: (.*)")


@dataclass
class Lane:
    """Steps that run one after another: their plan, the one running, and when it started."""

    name: str
    pending: list[str]
    current: str | None = None
    since: float = 0.0

    def remaining(self, now: float, est: dict[str, float]) -> float:
        left = sum(est.get(s, 60) for s in self.pending)
        if self.current:
            left += max(0.0, est.get(self.current, 60) - (now - self.since))
        return left


@dataclass
class Job:
    """One script run in the background, its log, and the lanes its output announces."""

    name: str
    argv: list[str]
    lanes: dict[str, Lane] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    read: int = 0
    done: bool = False
    rc: int | None = None
    first_step: str | None = None  # announced at launch, for a script that announces none
    # Off the critical path (the Kubernetes build): it yields the CPU when the two compete, and
    # takes what compiling leaves idle (links, downloads), so the slowest lane ends sooner.
    nice: int = 0


def load_times() -> dict[str, float]:
    est: dict[str, float] = dict(COLD)
    try:
        learned = json.loads(TIMES.read_text())
        est.update({k: float(v) for k, v in learned.items() if isinstance(v, (int, float))})
    except (OSError, ValueError):
        pass
    return est


def save_times(est: dict[str, float], measured: dict[str, float]) -> None:
    if not measured:
        return
    try:
        learned = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    except (OSError, ValueError):
        learned = {}
    learned.update({k: round(v) for k, v in measured.items()})
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(learned, indent=1, sort_keys=True) + "\n")


def mmss(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


class Prepare:
    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.est = load_times()
        self.measured: dict[str, float] = {}
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[prepare {mmss(time.monotonic() - self.t0)}] {text}", flush=True)

    def start(self) -> None:
        logs = CACHE / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            job.log = logs / f"prepare-{job.name}.log"
            with job.log.open("wb") as out:
                # A session of its own: a failure elsewhere stops the whole job, go builds too.
                job.proc = subprocess.Popen(
                    job.argv,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=(lambda n=job.nice: os.nice(n)) if job.nice else None,
                )
            self.say(f"{job.name}: started (log: {job.log})")
            if job.first_step:
                self.step(job, job.first_step, "start", time.monotonic())

    def follow(self, job: Job, now: float) -> None:
        """Read what the job logged since last time; move its lanes along."""
        assert job.log is not None
        with job.log.open("rb") as f:
            f.seek(job.read)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        job.read += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if m := PLAN.search(line):
                for part in m.group(1).split():
                    lane, _, steps = part.partition("=")
                    job.lanes[lane] = Lane(lane, [s for s in steps.split(",") if s])
            elif m := STEP.search(line):
                self.step(job, m.group(1), m.group(2), now)

    def step(self, job: Job, name: str, what: str, now: float) -> None:
        planned = next((ln for ln in job.lanes.values() if name in ln.pending), None)
        lane = planned or next((ln for ln in job.lanes.values() if ln.current == name), None)
        if lane is None:  # a step outside every plan: cached, or a script without a plan line
            lane = job.lanes.setdefault(name, Lane(name, []))
        if what == "start":
            if planned:
                lane.pending.remove(name)
                self.say(f"{job.name}: {name} (usually {mmss(self.est.get(name, 60))})")
            lane.current, lane.since = name, now
        elif lane.current == name:
            took = now - lane.since
            lane.current = None
            if what == "done" and took > MIN_MEASURED:
                self.measured[name] = took
                self.say(f"{job.name}: {name} done in {mmss(took)}")

    def heartbeat(self, now: float) -> None:
        running, left = [], 0.0
        for job in self.jobs:
            if job.done:
                continue
            lanes = [ln for ln in job.lanes.values() if ln.current or ln.pending]
            for ln in lanes:
                if ln.current:
                    running.append(f"{ln.current} {mmss(now - ln.since)}")
            if lanes:
                left = max(left, *(ln.remaining(now, self.est) for ln in lanes))
        ready = [j.name for j in self.jobs if j.done]
        self.say(
            f"running: {', '.join(running) or 'checks'}; ready: {', '.join(ready) or 'none'}; "
            f"about {max(1, round(left / 60))} min left"
        )

    def run(self) -> int:
        self.start()
        last_beat = time.monotonic()
        try:
            while not all(j.done for j in self.jobs):
                time.sleep(1)
                now = time.monotonic()
                for job in self.jobs:
                    if job.done:
                        continue
                    self.follow(job, now)
                    assert job.proc is not None
                    if (rc := job.proc.poll()) is not None:
                        self.follow(job, now)
                        job.done, job.rc = True, rc
                        for ln in job.lanes.values():  # a step that announces no end (the venv)
                            if ln.current and rc == 0:
                                self.step(job, ln.current, "done", now)
                        if rc != 0:
                            return self.fail(job)
                        self.say(f"{job.name}: ready")
                if now - last_beat >= HEARTBEAT:
                    self.heartbeat(now)
                    last_beat = now
        except KeyboardInterrupt:
            self.stop_all()
            raise
        save_times(self.est, self.measured)
        self.say("everything is ready")
        return 0

    def fail(self, job: Job) -> int:
        self.stop_all()
        save_times(self.est, self.measured)
        assert job.log is not None
        tail = job.log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        self.say(f"{job.name} failed (exit {job.rc}); its log: {job.log}")
        return 1

    def stop_all(self) -> None:
        for job in self.jobs:
            if job.proc is not None and job.proc.poll() is None:
                try:
                    os.killpg(job.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                job.proc.wait()


def jobs_for(purpose: str) -> list[Job]:
    make = os.environ.get("MAKE", "make")
    demo = purpose.startswith("demo")
    jobs = [
        Job("venv", [make, "--no-print-directory", "venv-demo" if demo else "venv"]),
        Job("binaries", ["bash", "hack/build-binaries.sh", "--for", purpose]),
    ]
    if os.geteuid() == 0:
        # Then the real node's store filled from them, while Kubernetes still builds: else the
        # first cluster start waits for that import (hack/localcluster/image_store.py).
        preload = f'exec "$0" {REPO / "hack/localcluster/image_store.py"}'
        script = f"bash hack/images/build.sh && {preload}"
        jobs.append(Job("images", ["bash", "-c", script, sys.executable], nice=10))
    else:
        print("[prepare] not root, so no images and no real node (tests/node will say so)")
    if not venv_current(demo=demo):  # `make venv` announces nothing: its one step is told here
        jobs[0].lanes["venv"] = Lane("venv", ["python_packages"])
        jobs[0].first_step = "python_packages"
    return jobs


def venv_current(*, demo: bool) -> bool:
    """Whether `make venv` (or `venv-demo`) has nothing to do: the Makefile's stamps for this
    pyproject.toml (the full venv serves the demo too)."""
    data = (REPO / "pyproject.toml").read_bytes()
    out = subprocess.run(["cksum"], input=data, capture_output=True, check=False).stdout
    if not out:
        return False
    venv, key = Path(os.environ.get("VENV", REPO / ".venv")), out.split()[0].decode()
    stamps = [f".installed-{key}", *([f".installed-demo-{key}"] if demo else [])]
    return any((venv / s).exists() for s in stamps)


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 (the system Python, before the venv exists)
        sys.exit("Python 3.11+ is needed (set PYTHON=python3.11)")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--for", dest="purpose", choices=["demo", "demo-kueue", "all"], default="all")
    args = ap.parse_args()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the jobs run in sessions of their own: stop them, as on Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    try:
        return Prepare(jobs_for(args.purpose)).run()
    except KeyboardInterrupt:
        print("[prepare] interrupted: the jobs were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
