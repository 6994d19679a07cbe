"""What the API server lets kubeckpt's own ServiceAccount tokens do, with config/default's RBAC and
admission policies (config/policy) installed: a stolen token of either account gets what the
code sends and nothing more (README.md, "Threat model").

The reconciler's token: exec only into a training container of a pod in an opted-in namespace,
only `cat` of the progress file or the python3 reader of it, exactly as progress_controller
sends them, no stdin or tty; pod patches only of the last-checkpoint annotations (in their value
form, on a training job's pods), as the controller sends them; TrainJob status only
status.trainerStatus; Events only its own, about a job. The webhook's token: its
configuration's caBundle only, as reconciler/admission publishes it, and no Secret but its
certificate's type. Neither can change the policies.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import LocalCluster, wait_for
from progress_controller.controller import ANNOTATION_FIELD_MANAGER, FIELD_MANAGER
from progress_controller.discovery import PYTORCHJOB, target_container
from progress_controller.lastcheckpoint import pod_patch, wanted
from progress_controller.reading import PYTHON_READER, READ_CAP, ReadError, read_file
from progress_controller.trainjob import trainer_status
from reconciler.admission import CertManager, ClientSecretStore
from reconciler.apply import apply_status, status_patch
from reconciler.client import Client
from reconciler.config import load_kubeconfig
from reconciler.errors import ApiError
from reconciler.events import EventRecorder
from reconciler.exec import ExecResult, exec_command
from reconciler.resources import PODS, Resource
from tests.support import policies as pol
from trainer_runtime.contract.env import POD_PROGRESS_FILE
from trainer_runtime.contract.jobkinds import TRAINJOB
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
)
from webhook.certs import cert_config

SYSTEM_NS = pol.SYSTEM_NS
MWC = "kubeckpt-webhook"
CERT_SECRET = "kubeckpt-webhook-certs"
TRAINING_LABELS = {
    "training.kubeflow.org/job-name": "llm",
    "training.kubeflow.org/operator-name": "pytorchjob-controller",
    "training.kubeflow.org/replica-type": "master",
    "training.kubeflow.org/replica-index": "0",
}
TRAINJOBS = Resource(TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural, TRAINJOB.kind)


@dataclass
class Accounts:
    reconciler: Path  # kubeconfigs with a fresh token of each ServiceAccount
    webhook: Path


@pytest.fixture(scope="module")
def accounts(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Accounts]:
    """config/default's RBAC and admission policies, and a token of each of its accounts."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    cluster.apply(pol.rendered(cluster, pol.RBAC_KINDS))
    docs = pol.policies(cluster)
    d = tmp_path_factory.mktemp("accounts")
    try:
        pol.install(cluster, docs)
        yield Accounts(
            cluster.token_kubeconfig(d / "reconciler", "kubeckpt-reconciler", SYSTEM_NS),
            cluster.token_kubeconfig(d / "webhook", "kubeckpt-webhook", SYSTEM_NS),
        )
    finally:
        pol.remove(cluster, docs)


def as_account(
    cluster: LocalCluster, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(cluster.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],  # type: ignore[union-attr]
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
async def reconciler(accounts: Accounts) -> AsyncIterator[Client]:
    """Our client library with the reconciler's token, as the progress controller runs."""
    c = Client(load_kubeconfig(accounts.reconciler))
    try:
        yield c
    finally:
        await c.close()


def training_pod(name: str, ns: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": TRAINING_LABELS if labels is None else labels,
            "annotations": {"team": "nlp"},
        },
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "busybox",
                    "env": [{"name": "TRAINING_PROGRESS_FILE", "value": POD_PROGRESS_FILE}],
                },
                {"name": "sidecar", "image": "busybox"},
            ]
        },
    }


def run_pod(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """Create `pod` on a KWOK node, let KWOK answer execs into it (on the host, in a directory
    of its own), and wait until it runs."""
    md = pod["metadata"]
    cluster.apply(pod)
    cluster.exec_dir(md["namespace"], md["name"])
    cluster.kubectl(
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        f"pod/{md['name']}",
        "-n",
        md["namespace"],
        "--timeout=60s",
        timeout=70,
    )
    return json.loads(
        cluster.kubectl("get", "pod", md["name"], "-n", md["namespace"], "-o", "json").stdout
    )


@pytest.fixture
def opted_in(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    """A running training pod in a namespace labelled kubeckpt.io/inject=enabled."""
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    return run_pod(cluster, training_pod("llm-master-0", namespace))


async def exec_admission(client: Client, pod: dict[str, Any], params: list[tuple[str, str]]) -> str:
    """Ask for an exec without upgrading the connection: admission (our policy) answers first,
    with a 403 that names the policy; an admitted request fails later for want of an upgrade.
    Returns the API server's message."""
    md = pod["metadata"]
    try:
        await client.request("POST", PODS.path(md["namespace"], md["name"], "exec"), params=params)
    except ApiError as e:
        return f"{e.status} {e}"
    return "200"


def params(
    argv: list[str], container: str | None = "pytorch", **flags: str
) -> list[tuple[str, str]]:
    out = [("command", a) for a in argv] + [("stdout", "true"), ("stderr", "true")]
    if container is not None:
        out.append(("container", container))
    return out + list(flags.items())


def refused_by(message: str, policy: str) -> bool:
    """Refused by `policy` (403 Forbidden; 422 Invalid for a malformed annotation value)."""
    return message[:4] in ("403 ", "422 ") and f"ValidatingAdmissionPolicy '{policy}'" in message


async def refusal(call: Awaitable[Any]) -> str:
    """The API server's answer to a write that should be refused: "403 <message>"; an accepted
    one fails the test."""
    try:
        await call
    except ApiError as e:
        return f"{e.status} {e}"
    raise AssertionError("the write was accepted")


# --- the reconciler: pods/exec ---------------------------------------------------------------


async def test_the_real_reads_are_admitted(
    cluster: LocalCluster, reconciler: Client, opted_in: dict[str, Any]
) -> None:
    """reading.read_file exactly as the controller calls it (its container and path from the
    pod), `cat` and then the python3 fallback: both run. KWOK runs them on the host, which has
    no /var/run/kubeckpt/progress.json: "missing" is the answer of a command that ran."""
    ns, name = opted_in["metadata"]["namespace"], opted_in["metadata"]["name"]
    container = target_container(opted_in, PYTORCHJOB)
    assert container is not None and container["name"] == "pytorch"
    sent: list[list[str]] = []

    async def exec_fn(client: Client, *args: Any, **kw: Any) -> ExecResult:
        sent.append(list(args[2]))
        return await exec_command(client, *args, **kw)

    with pytest.raises(ReadError) as e:
        await read_file(exec_fn, reconciler, ns, name, container["name"], POD_PROGRESS_FILE)
    assert e.value.reason == "ProgressFileMissing", e.value.message
    assert sent == [["cat", POD_PROGRESS_FILE]]

    async def without_cat(client: Client, *args: Any, **kw: Any) -> ExecResult:
        """The real exec, then an image without `cat` as the runtime reports it (exit 127)."""
        result = await exec_fn(client, *args, **kw)
        return ExecResult(exit_code=127) if args[2][0] == "cat" else result

    sent.clear()
    with pytest.raises(ReadError) as e:
        await read_file(without_cat, reconciler, ns, name, container["name"], POD_PROGRESS_FILE)
    assert e.value.reason == "ProgressFileMissing", e.value.message
    assert sent == [
        ["cat", POD_PROGRESS_FILE],
        ["python3", "-c", PYTHON_READER, POD_PROGRESS_FILE, str(READ_CAP)],
    ]


async def test_a_progress_file_set_elsewhere_is_an_exec_failure(
    reconciler: Client, opted_in: dict[str, Any]
) -> None:
    """A user who set TRAINING_PROGRESS_FILE to another path (here the runtime's default when
    nothing is injected): the read is refused, which the controller reports as ExecFailed."""
    md = opted_in["metadata"]
    with pytest.raises(ReadError) as e:
        await read_file(
            exec_command,
            reconciler,
            md["namespace"],
            md["name"],
            "pytorch",
            "/workspace/training_progress.json",
        )
    assert e.value.reason == "ExecFailed" and "403" in e.value.message, e.value.message


@pytest.mark.parametrize(
    "argv",
    [
        ["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"],
        ["cat", "/var/run/kubeckpt/../secrets/kubernetes.io/serviceaccount/token"],
        ["cat", "/var/run/kubeckpt/local/checkpoint-100/model.safetensors"],
        ["cat", POD_PROGRESS_FILE, "/var/run/secrets/kubernetes.io/serviceaccount/token"],
        ["sh", "-c", f"cat {POD_PROGRESS_FILE}"],
        ["/bin/cat", POD_PROGRESS_FILE],
        ["python3", "-c", "print(open('/etc/shadow').read())", POD_PROGRESS_FILE, str(READ_CAP)],
        ["python3", "-c", PYTHON_READER, POD_PROGRESS_FILE, str(10**9)],
        ["python3", "-c", PYTHON_READER + " ", POD_PROGRESS_FILE, str(READ_CAP)],
        ["python3", "-c", PYTHON_READER, "/etc/shadow", str(READ_CAP)],
    ],
)
async def test_any_other_command_is_refused(
    reconciler: Client, opted_in: dict[str, Any], argv: list[str]
) -> None:
    message = await exec_admission(reconciler, opted_in, params(argv))
    assert refused_by(message, "kubeckpt-reconciler-exec"), message
    assert "may run only `cat` or its python3 reader" in message, message


@pytest.mark.parametrize(
    ("container", "flags", "why"),
    [
        ("sidecar", {}, "training container"),
        (None, {}, "training container"),
        ("pytorch", {"stdin": "true"}, "stdin or a tty"),
        ("pytorch", {"tty": "true"}, "stdin or a tty"),
    ],
)
async def test_the_read_command_elsewhere_or_interactive_is_refused(
    reconciler: Client,
    opted_in: dict[str, Any],
    container: str | None,
    flags: dict[str, str],
    why: str,
) -> None:
    message = await exec_admission(
        reconciler, opted_in, params(["cat", POD_PROGRESS_FILE], container, **flags)
    )
    assert refused_by(message, "kubeckpt-reconciler-exec") and why in message, message


async def test_attach_and_port_forward_are_refused(
    reconciler: Client, opted_in: dict[str, Any]
) -> None:
    """Not granted by RBAC either; the policy keeps it so if a role ever grants more."""
    md = opted_in["metadata"]
    try:
        await reconciler.request(
            "POST",
            PODS.path(md["namespace"], md["name"], "attach"),
            params=[("container", "pytorch"), ("stdout", "true")],
        )
    except ApiError as e:
        assert e.status == 403, e
    else:
        raise AssertionError("attach was admitted")


async def test_exec_outside_opted_in_namespaces_is_refused(
    cluster: LocalCluster, reconciler: Client, namespace: str
) -> None:
    """The exact read command, in a training container: refused in kube-system, in kubeckpt's
    own namespace and in a namespace without an opt-in label (even for a pod that opted in by
    its own label: the admin opts the namespace in with kubeckpt.io/progress-exec=enabled)."""
    read = params(["cat", POD_PROGRESS_FILE])
    own_label = {**TRAINING_LABELS, "kubeckpt.io/inject": "true"}
    pods = [
        run_pod(cluster, training_pod("llm-master-0", namespace, own_label)),
        run_pod(cluster, training_pod(f"{namespace}-llm-master-0", "kube-system")),
        run_pod(cluster, training_pod(f"{namespace}-llm-master-0", SYSTEM_NS)),
    ]
    cluster.kubectl("label", "namespace", SYSTEM_NS, "kubeckpt.io/inject=enabled", "--overwrite")
    cluster.kubectl("label", "namespace", "kube-system", "kubeckpt.io/inject=enabled")
    try:
        for pod in pods:
            message = await exec_admission(reconciler, pod, read)
            assert refused_by(message, "kubeckpt-reconciler-exec"), message
            assert "kubeckpt.io/progress-exec=enabled" in message, message
    finally:
        cluster.kubectl("label", "namespace", "kube-system", "kubeckpt.io/inject-")
        cluster.kubectl("label", "namespace", SYSTEM_NS, "kubeckpt.io/inject-")
        for pod in pods[1:]:
            md = pod["metadata"]
            cluster.kubectl("delete", "pod", md["name"], "-n", md["namespace"], "--wait=false")
    # The admin's second label lets the reconciler read the pod that opted in by its own label.
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/progress-exec=enabled")
    message = await wait_admitted(reconciler, pods[0], read)
    assert not message.startswith("403"), message


async def wait_admitted(client: Client, pod: dict[str, Any], p: list[tuple[str, str]]) -> str:
    """The policy reads the namespace from the API server's cache: a label just set is seen
    within moments."""
    for _ in range(50):
        message = await exec_admission(client, pod, p)
        if not message.startswith("403"):
            return message
        await asyncio.sleep(0.2)
    return message


# --- the reconciler: pods, TrainJob status, Events ------------------------------------------


async def test_the_last_checkpoint_patch_as_the_controller_sends_it_is_allowed(
    cluster: LocalCluster, reconciler: Client, opted_in: dict[str, Any]
) -> None:
    md = opted_in["metadata"]
    status = {
        "checkpointing": {
            "latestCheckpoint": "/ckpt/ns/llm/checkpoint-150",
            "latestCheckpointTime": "2024-01-15T11:25:00+01:00",
        }
    }
    patch = pod_patch(wanted(status), opted_in)
    assert patch == {
        LAST_CHECKPOINT_TIME_ANNOTATION: "2024-01-15T10:25:00Z",
        LAST_CHECKPOINT_STEP_ANNOTATION: "150",
    }
    pods = reconciler.api(PODS)
    written = await pods.patch(
        md["name"],
        {"metadata": {"annotations": patch}},
        md["namespace"],
        patch_type="merge",
        field_manager=ANNOTATION_FIELD_MANAGER,
    )
    assert written["metadata"]["annotations"] == {"team": "nlp", **patch}
    # A checkpoint no longer known: the keys go (null in the merge patch).
    gone = pod_patch(wanted({"checkpointing": {}}), written)
    assert gone == dict.fromkeys(patch)
    written = await pods.patch(
        md["name"],
        {"metadata": {"annotations": gone}},
        md["namespace"],
        patch_type="merge",
        field_manager=ANNOTATION_FIELD_MANAGER,
    )
    assert written["metadata"]["annotations"] == {"team": "nlp"}


@pytest.mark.parametrize(
    ("patch_type", "patch", "why"),
    [
        (
            "strategic",
            {"spec": {"containers": [{"name": "pytorch", "image": "evil.example/miner"}]}},
            "spec",
        ),
        ("merge", {"spec": {"activeDeadlineSeconds": 1}}, "spec"),
        ("merge", {"metadata": {"labels": {"kubeckpt.io/injected": "false"}}}, "labels"),
        ("merge", {"metadata": {"labels": {"training.kubeflow.org/job-name": None}}}, "labels"),
        ("merge", {"metadata": {"finalizers": ["example.com/keep"]}}, "finalizers"),
        (
            "merge",
            {
                "metadata": {
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1"}
                    ]
                }
            },
            "owner references",
        ),
        ("merge", {"metadata": {"annotations": {"team": "vision"}}}, "only the annotations"),
        ("merge", {"metadata": {"annotations": {"team": None}}}, "only the annotations"),
        (
            "merge",
            {"metadata": {"annotations": {"kubeckpt.io/status": "{}"}}},
            "only the annotations",
        ),
        (
            "merge",
            {"metadata": {"annotations": {LAST_CHECKPOINT_TIME_ANNOTATION: "yesterday"}}},
            "RFC 3339",
        ),
        (
            "merge",
            {"metadata": {"annotations": {LAST_CHECKPOINT_STEP_ANNOTATION: "1; rm -rf"}}},
            "decimal integer",
        ),
    ],
)
async def test_any_other_pod_change_is_refused(
    cluster: LocalCluster,
    reconciler: Client,
    opted_in: dict[str, Any],
    patch_type: str,
    patch: dict[str, Any],
    why: str,
) -> None:
    md = opted_in["metadata"]
    message = await refusal(
        reconciler.api(PODS).patch(md["name"], patch, md["namespace"], patch_type=patch_type)  # type: ignore[arg-type]
    )
    assert refused_by(message, "kubeckpt-reconciler-pods") and why in message, message
    after = json.loads(
        cluster.kubectl("get", "pod", md["name"], "-n", md["namespace"], "-o", "json").stdout
    )
    assert after["spec"] == opted_in["spec"]
    assert after["metadata"]["labels"] == opted_in["metadata"]["labels"]
    assert after["metadata"]["annotations"] == opted_in["metadata"]["annotations"]


async def test_pod_writes_outside_training_pods_are_refused(
    cluster: LocalCluster, reconciler: Client, namespace: str
) -> None:
    """The annotation alone, on a pod that is no training job's, and on a training pod in
    kube-system; and no delete (RBAC's), eviction or ephemeral container anywhere."""
    annotation = {"metadata": {"annotations": {LAST_CHECKPOINT_STEP_ANNOTATION: "150"}}}
    plain = run_pod(cluster, training_pod("web", namespace, {"app": "web"}))
    system = run_pod(cluster, training_pod(f"{namespace}-llm-master-0", "kube-system"))
    pods = reconciler.api(PODS)
    try:
        for pod in (plain, system):
            md = pod["metadata"]
            message = await refusal(pods.patch(md["name"], annotation, md["namespace"]))
            assert refused_by(message, "kubeckpt-reconciler-pods"), message
            assert "only pods of a training job" in message, message
    finally:
        cluster.kubectl(
            "delete", "pod", system["metadata"]["name"], "-n", "kube-system", "--wait=false"
        )
    message = await refusal(pods.delete("web", namespace))
    assert message.startswith("403 ") and "cannot delete" in message, message


@pytest.fixture
def trainjob_crd(cluster: LocalCluster) -> Iterator[None]:
    """A TrainJob CRD of our own (status.trainerStatus and another status field), as
    tests/integration/progress/test_progress_trainjob.py installs one: Kubeflow Trainer, when a
    real-node test started it, goes with its CRD first."""
    if cluster.trainer.started:  # its TrainJobs' finalizers need Trainer to go
        cluster.kubectl(
            "delete", "trainjobs", "-A", "--all", "--timeout=60s", check=False, timeout=90
        )
    cluster.stop_trainer()
    crd = f"{TRAINJOB.plural}.{TRAINJOB.group}"
    cluster.kubectl("delete", "crd", crd, "--ignore-not-found", "--timeout=60s", timeout=90)
    status = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "trainerStatus": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    }
    cluster.apply(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd},
            "spec": {
                "group": TRAINJOB.group,
                "scope": "Namespaced",
                "names": {
                    "kind": TRAINJOB.kind,
                    "plural": TRAINJOB.plural,
                    "singular": "trainjob",
                    "listKind": "TrainJobList",
                },
                "versions": [
                    {
                        "name": TRAINJOB.version,
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                    "status": status,
                                },
                            }
                        },
                    }
                ],
            },
        }
    )
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}")
    try:
        yield
    finally:
        cluster.kubectl("delete", "crd", crd, "--timeout=60s", check=False, timeout=90)


async def test_trainjob_status_only_trainer_status(
    cluster: LocalCluster,
    reconciler: Client,
    namespace: str,
    trainjob_crd: None,
) -> None:
    """status.trainerStatus applied as the controller applies it: allowed; any other status
    field: refused."""
    job = {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": {"name": "llm", "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    wait_for(
        lambda: (
            cluster.kubectl("apply", "-f", "-", input=json.dumps(job), check=False).returncode == 0
        ),
        "the TrainJob resource to be served",
        timeout=30,
    )
    cluster.kubectl(
        "patch",
        "trainjob",
        "llm",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [{"type": "Created", "status": "True"}]}}),
    )
    ts = trainer_status({"step": 50, "totalSteps": 100, "percentComplete": "50.0"})
    assert ts is not None
    body = status_patch(
        TRAINJOB.api_version, TRAINJOB.kind, "llm", namespace, {"trainerStatus": ts}
    )
    written = await apply_status(reconciler.api(TRAINJOBS), body, field_manager=FIELD_MANAGER)
    assert written["status"]["trainerStatus"] == ts
    assert written["status"]["conditions"] == [{"type": "Created", "status": "True"}]
    for status in (
        {"conditions": [{"type": "Complete", "status": "True"}]},
        {"conditions": None},
        {"jobsStatus": [{"name": "node"}]},
    ):
        message = await refusal(
            reconciler.api(TRAINJOBS).patch(
                "llm", {"status": status}, namespace, subresource="status"
            )
        )
        assert refused_by(message, "kubeckpt-reconciler-trainjobs"), message
        assert "only a TrainJob's status.trainerStatus" in message, message


def job_object(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llm", "namespace": namespace, "uid": "0d1c5f3e-0000-4000-8000-1"},
    }


async def test_the_reconcilers_own_events_are_allowed(
    cluster: LocalCluster, reconciler: Client, namespace: str
) -> None:
    """reconciler/events.py's recorder, as the progress controller makes it: an Event created,
    then a repeat aggregated (a patch of count, lastTimestamp and message)."""
    recorder = EventRecorder(reconciler, "kubeckpt-reconciler")
    task = asyncio.create_task(recorder.run())
    # The controller records each Event on the job and on its TrainingProgress.
    progress = {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": {"name": "llm", "namespace": namespace, "uid": "0d1c5f3e-0000-4000-8000-2"},
    }
    try:
        for _ in range(2):
            for about in (job_object(namespace), progress):
                assert recorder.event(about, "Normal", "CheckpointSaved", "step 150")
            await asyncio.wait_for(recorder.flush(), 30)
    finally:
        task.cancel()
    assert (recorder.stats["sent"], recorder.stats["aggregated"], recorder.stats["failed"]) == (
        2,
        2,
        0,
    )
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    saved = [e for e in events["items"] if e["reason"] == "CheckpointSaved"]
    assert sorted(e["involvedObject"]["kind"] for e in saved) == ["PyTorchJob", "TrainingProgress"]
    assert all(e["count"] == 2 and e["reportingComponent"] == "kubeckpt-reconciler" for e in saved)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"source": {"component": "kubelet"}}, "only its own Events"),
        ({"reportingComponent": "default-scheduler"}, "only its own Events"),
        ({"involvedObject": {"apiVersion": "v1", "kind": "Pod"}}, "only about a training job"),
        (
            {
                "involvedObject": {
                    "apiVersion": "kubeckpt.example/v1alpha1",
                    "kind": "TrainingProgress",
                }
            },
            "only about a training job",
        ),
        (
            {"involvedObject": {"apiVersion": "kubeckpt.io/v1alpha1", "kind": "CheckpointPolicy"}},
            "only about a training job",
        ),
        (
            {"involvedObject": {"apiVersion": "example.com/v1", "kind": "PyTorchJob"}},
            "only about a training job",
        ),
    ],
)
def test_other_events_are_refused(
    cluster: LocalCluster, accounts: Accounts, namespace: str, change: dict, why: str
) -> None:
    """(An involved object in another namespace the API server refuses itself.)"""
    ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}
    ref |= change.pop("involvedObject", {}) | {"name": "llm", "namespace": namespace}
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "llm.forged", "namespace": namespace},
        "involvedObject": ref,
        "type": "Warning",
        "reason": "Stalled",
        "message": "forged",
        "source": {"component": "kubeckpt-reconciler"},
        "reportingComponent": "kubeckpt-reconciler",
        "reportingInstance": "x",
    } | change
    proc = as_account(cluster, accounts.reconciler, "create", "-f", "-", input=json.dumps(event))
    assert pol.denied_by(proc, "kubeckpt-reconciler-events") and why in proc.stderr, proc.stderr


def test_events_in_kube_system_are_refused(cluster: LocalCluster, accounts: Accounts) -> None:
    ref = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "x",
        "namespace": "kube-system",
    }
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "x.forged", "namespace": "kube-system"},
        "involvedObject": ref,
        "reason": "Stalled",
        "message": "forged",
        "source": {"component": "kubeckpt-reconciler"},
        "reportingComponent": "kubeckpt-reconciler",
    }
    proc = as_account(cluster, accounts.reconciler, "create", "-f", "-", input=json.dumps(event))
    assert pol.denied_by(proc, "kubeckpt-reconciler-events"), proc.stderr


# --- the webhook: its configuration ---------------------------------------------------------


@pytest.fixture
def configuration(cluster: LocalCluster) -> Iterator[dict[str, Any]]:
    """config/default's MutatingWebhookConfiguration, made to match no pod (its Service does
    not run here), and the webhook's certificate Secret removed afterwards if it made one."""
    (mwc,) = pol.rendered(cluster, ("MutatingWebhookConfiguration",))
    assert mwc["metadata"]["name"] == MWC
    for w in mwc["webhooks"]:
        w["objectSelector"] = {"matchLabels": {"kubeckpt.io/policy-test": "no-pod-has-this"}}
    had_secret = (
        cluster.kubectl("get", "secret", CERT_SECRET, "-n", SYSTEM_NS, check=False).returncode == 0
    )
    cluster.apply(mwc)
    try:
        yield mwc
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", MWC, check=False)
        if not had_secret:
            cluster.kubectl("delete", "secret", CERT_SECRET, "-n", SYSTEM_NS, check=False)


def get_mwc(cluster: LocalCluster) -> dict[str, Any]:
    return json.loads(
        cluster.kubectl("get", "mutatingwebhookconfiguration", MWC, "-o", "json").stdout
    )


async def test_the_ca_bundle_as_the_webhook_publishes_it_is_allowed(
    cluster: LocalCluster, accounts: Accounts, configuration: dict[str, Any]
) -> None:
    """reconciler.admission CertManager with the webhook's token: it creates its Secret and writes
    the CA into every entry's caBundle, and nothing else of the configuration changes."""
    before = get_mwc(cluster)
    client = Client(load_kubeconfig(accounts.webhook))
    try:
        manager = CertManager(
            ClientSecretStore(client),
            cert_config(service="kubeckpt-webhook", namespace=SYSTEM_NS, webhook_config_name=MWC),
        )
        result = await manager.reconcile()
    finally:
        await client.close()
    assert result.published, manager.last_error
    after = get_mwc(cluster)
    assert all(w["clientConfig"].get("caBundle") for w in after["webhooks"])
    for w in after["webhooks"]:
        del w["clientConfig"]["caBundle"]
    assert after["webhooks"] == before["webhooks"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]


def _ops(mwc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """JSON patches the webhook's code never sends, each with what the refusal names."""
    extra = json.loads(json.dumps(mwc["webhooks"][0]))
    extra["name"] = "extra.inject.kubeckpt.io"
    bundle = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"
    return [
        (
            "caBundle",
            [
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle},
                {"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 30},
            ],
        ),
        (
            "caBundle",
            [
                {
                    "op": "replace",
                    "path": "/webhooks/0/rules/0/operations",
                    "value": ["CREATE", "UPDATE"],
                }
            ],
        ),
        ("caBundle", [{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {}}]),
        ("caBundle", [{"op": "replace", "path": "/webhooks/1/objectSelector", "value": {}}]),
        ("caBundle", [{"op": "remove", "path": "/webhooks/0/matchConditions"}]),
        (
            "caBundle",
            [{"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "evil"}],
        ),
        (
            "caBundle",
            [
                {
                    "op": "replace",
                    "path": "/webhooks/0/clientConfig/service/namespace",
                    "value": "default",
                }
            ],
        ),
        ("caBundle", [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]),
        (
            "caBundle",
            [{"op": "replace", "path": "/webhooks/0/reinvocationPolicy", "value": "Never"}],
        ),
        ("caBundle", [{"op": "add", "path": "/webhooks/-", "value": extra}]),
        ("caBundle", [{"op": "remove", "path": "/webhooks/1"}]),
        ("metadata", [{"op": "add", "path": "/metadata/labels/extra", "value": "x"}]),
        ("metadata", [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}]),
    ]


def test_any_other_configuration_change_is_refused(
    cluster: LocalCluster, accounts: Accounts, configuration: dict[str, Any]
) -> None:
    before = get_mwc(cluster)
    for why, ops in _ops(before):
        proc = as_account(
            cluster,
            accounts.webhook,
            "patch",
            "mutatingwebhookconfiguration",
            MWC,
            "--type=json",
            "-p",
            json.dumps(ops),
        )
        assert pol.denied_by(proc, "kubeckpt-webhook-configuration"), (ops, proc.stderr)
        assert why in proc.stderr, (ops, proc.stderr)
    after = get_mwc(cluster)
    assert after["webhooks"] == before["webhooks"]
    # A caBundle alone, even by hand: allowed (that is the right the certificate needs).
    proc = as_account(
        cluster,
        accounts.webhook,
        "patch",
        "mutatingwebhookconfiguration",
        MWC,
        "--type=json",
        "-p",
        json.dumps(_ops(before)[0][1][:1]),
    )
    assert proc.returncode == 0, proc.stderr
    # Delete is RBAC's to refuse; so is any other configuration.
    for args in (
        ["delete", "mutatingwebhookconfiguration", MWC],
        [
            "patch",
            "validatingadmissionpolicy",
            "kubeckpt-webhook-configuration",
            "--type=merge",
            "-p",
            "{}",
        ],
    ):
        proc = as_account(cluster, accounts.webhook, *args)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr


def test_the_webhook_mints_no_token_secret(cluster: LocalCluster, accounts: Accounts) -> None:
    """A Secret of type service-account-token for the reconciler's account, which the token
    controller would fill with a long-lived token: refused."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "minted",
            "namespace": SYSTEM_NS,
            "annotations": {"kubernetes.io/service-account.name": "kubeckpt-reconciler"},
        },
        "type": "kubernetes.io/service-account-token",
    }
    proc = as_account(cluster, accounts.webhook, "create", "-f", "-", input=json.dumps(secret))
    assert pol.denied_by(proc, "kubeckpt-webhook-secrets"), proc.stderr
    assert cluster.kubectl("get", "secret", "minted", "-n", SYSTEM_NS, check=False).returncode


# --- the policies themselves ----------------------------------------------------------------


@pytest.mark.parametrize("account", ["kubeckpt-reconciler", "kubeckpt-webhook"])
@pytest.mark.parametrize("verb", ["create", "update", "patch", "delete"])
@pytest.mark.parametrize(
    "resource",
    [
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    ],
)
def test_no_account_of_ours_can_change_the_policies(
    cluster: LocalCluster, accounts: Accounts, account: str, verb: str, resource: str
) -> None:
    who = f"system:serviceaccount:{SYSTEM_NS}:{account}"
    proc = cluster.kubectl("auth", "can-i", verb, resource, f"--as={who}", check=False)
    assert proc.stdout.strip() == "no", (who, verb, resource, proc.stdout)
