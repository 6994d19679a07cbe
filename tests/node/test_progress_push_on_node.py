"""Progress push for real (issue 26): an unmodified HF Trainer script (`report_to="all"`, so
transformers adds its KubeflowCallback when KUBEFLOW_TRAINER_SERVER_URL is set) in a TrainJob on
the real node, its CheckpointPolicy with `progress.push: true`, Trainer's TrainJobStatus gate off.
The webhook injects our URL, a projected token of audience kubeckpt-progress and the CA, which it
has from the CA Secret's ca.crt and stamps into the pod's annotation (no ConfigMap in the tenant
namespace); the callback POSTs to the reconciler's endpoint (installed as
config/components/progress-push does, with a CA and Secrets made here instead of cert-manager's),
and the job's TrainingProgress shows
`source: push` while it trains; the final status still comes from the termination message.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from reconciler.pki import issue_serving, make_ca
from tests.node.test_trainjob_on_node import (
    complete,
    job_logs,
    logs,
    prepare,
    status_managers,
    tp_status,
    trainjob,
    trainjob_obj,
    wait_rank,
)

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "config" / "components" / "progress-push"
SYSTEM_NS = "kubeckpt-system"
HOST = "kubeckpt-progress.kubeckpt-system.svc"
pytestmark = pytest.mark.timeout(900)


def _patches() -> dict[tuple[str, str], list[dict] | dict]:
    """The component's Deployment patches (config/components/progress-push/kustomization.yaml)
    by (Deployment, json or strategic), as its kustomization lists them."""
    import yaml

    k = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    out: dict[tuple[str, str], list[dict] | dict] = {}
    for p in k["patches"]:
        body = yaml.safe_load(p["patch"])
        out[(p["target"]["name"], "json" if isinstance(body, list) else "strategic")] = body
    return out


@pytest.fixture(scope="module")
def addon_with_push(
    cluster: LocalCluster, real_node: RealNode, tmp_path_factory
) -> Iterator[bytes]:
    """config/local plus the push endpoint; yields the endpoint's CA, which the webhook reads from
    the CA Secret's ca.crt (as the component mounts it)."""
    cluster.start_trainer(status_gate=False)
    kubeckpt_addon.install(cluster)
    now, hour = dt.datetime.now(dt.UTC), dt.timedelta(hours=1)
    ca = make_ca("kubeckpt-progress-ca", now=now, validity=24 * hour, backdate=hour)
    leaf = issue_serving(
        ca, dns_names=[HOST, f"{HOST}.cluster.local"], now=now, validity=24 * hour, backdate=hour
    )
    d = tmp_path_factory.mktemp("progress-certs")
    (d / "tls.crt").write_bytes(leaf.cert_pem)
    (d / "tls.key").write_bytes(leaf.key_pem)
    (d / "ca.crt").write_bytes(ca.cert_pem)
    cluster.kubectl(
        "create", "secret", "tls", "kubeckpt-progress-tls", "-n", SYSTEM_NS,
        f"--cert={d / 'tls.crt'}", f"--key={d / 'tls.key'}",
    )  # fmt: skip
    cluster.kubectl(
        "create", "secret", "generic", "kubeckpt-progress-ca", "-n", SYSTEM_NS,
        f"--from-file=ca.crt={d / 'ca.crt'}",
    )  # fmt: skip
    cluster.kubectl("apply", "-f", str(COMPONENT / "service.yaml"))
    patches = _patches()
    for (name, kind), body in patches.items():
        cluster.kubectl(
            "patch", "deployment", name, "-n", SYSTEM_NS, f"--type={kind}",
            "-p", json.dumps(body),
        )  # fmt: skip
    for name in sorted({name for name, _ in patches}):
        cluster.kubectl(
            "rollout", "status", f"deployment/{name}", "-n", SYSTEM_NS, "--timeout=180s",
            timeout=200,
        )  # fmt: skip
    try:
        yield ca.cert_pem
    finally:
        cluster.kubectl("delete", "service", "kubeckpt-progress", "-n", SYSTEM_NS, check=False)
        for secret in ("kubeckpt-progress-tls", "kubeckpt-progress-ca"):
            cluster.kubectl("delete", "secret", secret, "-n", SYSTEM_NS, check=False)
        kubeckpt_addon.uninstall(cluster)


def test_unmodified_hf_script_feeds_training_progress_through_push(
    cluster: LocalCluster, addon_with_push: bytes, node_ns: str, tmp_path: Path
) -> None:
    ns, job = node_ns, "hf-push"
    volume = tmp_path / "volume"
    prepare(cluster, ns, volume, [job], save_steps=1000)
    cluster.kubectl(
        "patch", "checkpointpolicy", "default", "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": {"progress": {"push": True}}}),
    )  # fmt: skip
    cmd = "torchrun /scripts/hf_train_func.py --steps=120 --save-steps=40 --sleep=0.25"
    cluster.apply([trainjob(job, ns, cmd, nodes=1)])
    pod = wait_rank(cluster, ns, job, 0, 240)
    node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
    env = {e["name"]: e.get("value") for e in node["env"]}
    url = (
        f"https://{HOST}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{job}/status"
    )
    assert env["KUBEFLOW_TRAINER_SERVER_URL"] == url == env["KUBECKPT_PROGRESS_PUSH_URL"]
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    sources = vols["kubeckpt-progress-push"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["audience"] == "kubeckpt-progress"
    # The CA from the webhook, in the pod's own annotation: no ConfigMap in the namespace.
    assert (
        pod["metadata"]["annotations"]["kubeckpt.io/progress-push-ca"] == addon_with_push.decode()
    )
    assert "downwardAPI" in sources[1] and "configMap" not in sources[1]
    assert "kubeckpt-progress-ca" not in cluster.kubectl("get", "configmaps", "-n", ns).stdout

    pushed = wait_for(
        lambda: (
            (st := tp_status(cluster, ns, job)).get("source") == "push"
            and (st.get("step") or 0) >= 10
            and st
        ),
        "a step recorded from a push",
        240,
    )
    assert pushed["observedPod"] == pod["metadata"]["name"]
    out = logs(cluster, ns, pod["metadata"]["name"])
    assert "KubeflowCallback active: True" in out, out[-2000:]
    wait_for(lambda: complete(cluster, ns, job), "the TrainJob Complete", 300)
    final = tp_status(cluster, ns, job)
    assert final.get("step") == 120, (final, job_logs(cluster, ns, job)[-2000:])
    # trainerStatus is kubeckpt's (our URL is not Trainer's status server): one writer.
    managers = status_managers(trainjob_obj(cluster, ns, job))
    assert "trainer-status" not in managers
    assert "f:trainerStatus" in json.dumps(managers.get("kubeckpt", {}))
