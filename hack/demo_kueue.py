"""`make demo DEMO_ARGS=--kueue`: the scheduler that really preempts, on the demo's cluster.

1. The demo's local cluster and real node, Kueue beside it (built from its module, with the
   PyTorchJob integration; localcluster/kueue.py), the add-on from config/local.
2. A ClusterQueue with room for one demo job (its two pods ask 250m CPU and 512Mi each), whose
   higher-priority workloads preempt lower ones; a LocalQueue in the namespace; the
   WorkloadPriorityClasses `low` (100) and `high` (1000).
3. The demo's unchanged PyTorchJob, queued at `low`: Kueue admits it; it trains past a periodic
   checkpoint and half its steps.
4. A `high` PyTorchJob arrives. Kueue evicts the low one (it suspends it): the training-operator
   deletes its pods, the kubelet runs the injected preStop, both ranks agree on one step and save.
   The TrainingProgress says Suspended while the high job runs to completion.
5. Kueue readmits the low job: it resumes at exactly the saved step and completes; with
   --reference, bitwise equal to an uninterrupted copy of it (not queued, so Kueue leaves it be).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from demo import (
    JOB,
    NAMESPACE,
    PODS,
    REFERENCE,
    Checks,
    apply_shown,
    check_end_state,
    check_finished,
    check_resumed,
    condition,
    demo_job,
    failed,
    follow_until_half,
    install_and_prepare,
    job_condition,
    logs,
    progress_file,
    remove_demo,
    report,
    say,
    show,
    step_title,
    stop_cluster,
    tp_status,
)

from localcluster import LocalCluster, wait_for
from localcluster.kueue import queue_objects
from localcluster.pods import running, wait_pod

URGENT = "urgent"
QUEUE = "demo-queue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PRIORITIES = {"low": 100, "high": 1000}


def queued(job: dict, priority: str) -> dict:
    """The job submitted to the demo's LocalQueue at `priority`: two labels, nothing else."""
    job["metadata"].setdefault("labels", {}).update({QUEUE_LABEL: QUEUE, PRIORITY_LABEL: priority})
    return job


def workload_condition(cluster: LocalCluster, job: str, type_: str) -> dict | None:
    """A condition of the Workload Kueue made for `job` (its controlling owner)."""
    out = cluster.kubectl("get", "workloads", "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode:
        return None
    for wl in json.loads(out.stdout)["items"]:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "PyTorchJob" and o.get("name") == job for o in owners):
            for c in wl.get("status", {}).get("conditions") or []:
                if c.get("type") == type_:
                    return c
    return None


def run(args: argparse.Namespace, work: Path, cluster: LocalCluster | None = None) -> int:
    """The Kueue scenario; on `cluster` if given (the tests' session cluster), else its own."""
    checks = Checks()
    t_start = time.monotonic()
    steps, step_seconds = (400, 0.1) if args.fast else (600, 0.15)
    urgent_steps = steps // 4
    save_steps = steps // 4
    own = cluster is None
    if cluster is None:
        step_title("starting the local cluster, its real node and Kueue")
        cluster = LocalCluster(nodes=0, real_nodes=1)
        cluster.start()
        say(f"   ready in {cluster.timings['start']:.1f} s; KUBECONFIG={cluster.kubeconfig}")
    node = cluster.start_real_node()
    kueue_was_up = cluster.kueue.started
    try:
        cluster.start_kueue()
        show(cluster, "get", "nodes", "-o", "wide")
        jobs = (JOB, REFERENCE, URGENT)
        storage = install_and_prepare(cluster, checks, work, save_steps, own=own, jobs=jobs)

        step_title("Kueue: a ClusterQueue with room for one job, a LocalQueue, two priorities")
        say(f"   quota: 500m CPU, 1Gi memory (one demo job); {PRIORITIES}")
        objects = queue_objects(
            NAMESPACE, cpu="500m", memory="1Gi", priorities=PRIORITIES, queue=QUEUE
        )
        for obj in objects:
            apply_shown(cluster, obj)
        show(cluster, "get", "clusterqueue,localqueue,workloadpriorityclass", "-n", NAMESPACE)

        step_title("the demo's PyTorchJob, queued at low priority (two labels)")
        apply_shown(cluster, queued(demo_job(JOB, steps, step_seconds, tolerate=node.taint), "low"))
        if args.reference:
            say("   and an uninterrupted copy, not queued (Kueue leaves it be):")
            apply_shown(cluster, demo_job(REFERENCE, steps, step_seconds, tolerate=node.taint))
        first = {p: wait_pod(cluster, NAMESPACE, p, running, "running", timeout=180) for p in PODS}
        show(cluster, "get", "workloads,pytorchjob,pods", "-n", NAMESPACE)
        follow_until_half(cluster, checks, steps, step_seconds)

        step_title("a high-priority job arrives: Kueue evicts the low one to make room")
        before = int(progress_file(cluster).get("step") or 0)
        t_preempt = time.monotonic()
        urgent = demo_job(URGENT, urgent_steps, step_seconds, tolerate=node.taint)
        apply_shown(cluster, queued(urgent, "high"))

        def eviction() -> dict | None:
            c = workload_condition(cluster, JOB, "Evicted")
            return c if c and c.get("status") == "True" else None

        evicted = wait_for(eviction, "Kueue to evict the low-priority job", timeout=120)
        say(f"   Workload condition Evicted: {evicted.get('reason')}: {evicted.get('message')}")
        wait_for(
            lambda: (
                not any(
                    cluster.kubectl("get", "pod", p, "-n", NAMESPACE, check=False).returncode == 0
                    for p in PODS
                )
            ),
            "the evicted job's pods to go",
            timeout=300,
        )
        gone = time.monotonic() - t_preempt
        say(f"   both pods gone {gone:.1f} s after the high job arrived (step {before} before it)")

        def suspended() -> dict | None:
            st = tp_status(cluster)
            return st if (condition(st, "Progressing") or "") == "False" and st else None

        wait_for(suspended, "the TrainingProgress to say Suspended", timeout=90)
        show(cluster, "get", "workloads,pytorchjob,tp", "-n", NAMESPACE)
        tp = tp_status(cluster)
        progressing = next(
            (c for c in tp.get("conditions") or [] if c.get("type") == "Progressing"), {}
        )
        message = progressing.get("message") or ""
        checks.check(
            progressing.get("reason") == "Suspended" and "evicted by Kueue" in message,
            f"the TrainingProgress says Suspended, evicted by Kueue, while it waits: {message}",
        )
        checks.check(
            f"PyTorchJob {NAMESPACE}/{URGENT}" in message,
            f"it names the preemptor, PyTorchJob {NAMESPACE}/{URGENT}",
        )

        step_title("the high-priority job runs to completion")
        wait_for(
            lambda: job_condition(cluster, URGENT, "Succeeded") == "True",
            "the high-priority job to succeed",
            timeout=urgent_steps * step_seconds * 6 + 240,
        )
        show(cluster, "get", "workloads,pytorchjob", "-n", NAMESPACE)
        checks.check(
            f"finished at step {urgent_steps}" in logs(cluster, f"{URGENT}-master-0"),
            f"the high-priority job finished at step {urgent_steps}",
        )

        title = "Kueue readmits the low-priority job; its pods come back and resume"
        jit_step, t_resumed = check_resumed(
            cluster, checks, first, before, storage, t_preempt, title=title
        )
        check_finished(cluster, checks, steps, step_seconds, reference=args.reference)
        st = check_end_state(cluster, checks, steps)

        step_title("summary")
        ck = st.get("checkpointing") or {}
        say(
            f"   steps lost: {max(0, before - jit_step)} (step {before} when the high job "
            f"arrived; both ranks saved step {jit_step} and resumed there)\n"
            f"   last save {ck.get('lastSaveSeconds')} s; eviction to pods gone: {gone:.1f} s; "
            f"to the first resumed step (the high job ran between): {t_resumed:.1f} s"
        )
        return report(cluster, checks, t_start, keep=args.keep and own)
    except Exception as e:
        return failed(cluster, e, "workloads,pods,tp,events")
    finally:
        if own:
            stop_cluster(cluster)
        else:
            _remove(cluster, stop_kueue=not kueue_was_up)


def _remove(cluster: LocalCluster, *, stop_kueue: bool) -> None:
    remove_demo(cluster)
    cluster.kubectl("delete", "clusterqueue", f"cq-{NAMESPACE}", "--ignore-not-found", check=False)
    if stop_kueue:
        cluster.stop_kueue()
