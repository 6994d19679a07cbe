"""progress.push: the webhook injects the push URL, a projected token of our audience and the CA
(from its own annotation when the webhook has the CA, else the namespace's ConfigMap); Trainer's
own status server, when configured on the pod, is kept."""

from __future__ import annotations

import datetime as dt
import json

import jsonpatch

from progress_controller.push_auth import PUSH_AUDIENCE
from progress_controller.trainjob import trainer_status_server
from reconciler.pki import make_ca
from tests.unit.webhook.test_mutation import NS, env_of, pod, policy
from webhook.mutation import mutate
from webhook.push_injection import PUSH_CA_ANNOTATION, PUSH_VOLUME

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
YEAR, HOUR = dt.timedelta(days=365), dt.timedelta(hours=1)
URL = (
    "https://kubeckpt-progress.kubeckpt-system.svc"
    "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/job-x/status"
)


def test_off_by_default() -> None:
    r = mutate(pod(), policy(), NS)
    env = env_of(r.pod)
    assert "KUBECKPT_PROGRESS_PUSH_URL" not in env and "KUBEFLOW_TRAINER_SERVER_URL" not in env
    assert "kubeckpt-progress-push" not in {v["name"] for v in r.pod["spec"]["volumes"]}


def test_push_injects_url_token_and_ca() -> None:
    r = mutate(pod(), policy(progress={"push": True}), NS)
    env = env_of(r.pod)
    assert env["KUBECKPT_PROGRESS_PUSH_URL"]["value"] == URL
    assert env["KUBEFLOW_TRAINER_SERVER_URL"]["value"] == URL  # what KubeflowCallback reads
    token = env["KUBEFLOW_TRAINER_SERVER_TOKEN"]["value"]
    ca = env["KUBEFLOW_TRAINER_SERVER_CA_CERT"]["value"]
    assert token == env["KUBECKPT_PROGRESS_PUSH_TOKEN"]["value"]
    assert ca == env["KUBECKPT_PROGRESS_PUSH_CA"]["value"]
    vol = next(v for v in r.pod["spec"]["volumes"] if v["name"] == "kubeckpt-progress-push")
    sa, cm = vol["projected"]["sources"]
    assert sa["serviceAccountToken"]["audience"] == PUSH_AUDIENCE
    assert sa["serviceAccountToken"]["expirationSeconds"] == 600
    assert cm["configMap"]["optional"] is True
    c = next(c for c in r.pod["spec"]["containers"] if c["name"] == "pytorch")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "kubeckpt-progress-push")
    assert mount["readOnly"] is True
    assert token == f"{mount['mountPath']}/token" and ca == f"{mount['mountPath']}/ca.crt"
    # Our own URL is not Trainer's status server: we still own trainerStatus.
    assert not trainer_status_server(c)


def test_trainers_own_status_server_is_not_overridden() -> None:
    p = pod()
    theirs = {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "https://trainer:10443/x"}
    p["spec"]["containers"][1]["env"].append(theirs)
    r = mutate(p, policy(progress={"push": True}), NS)
    env = env_of(r.pod)
    assert env["KUBEFLOW_TRAINER_SERVER_URL"] == theirs
    assert "KUBEFLOW_TRAINER_SERVER_TOKEN" not in env
    assert env["KUBECKPT_PROGRESS_PUSH_URL"]["value"] == URL
    c = next(c for c in r.pod["spec"]["containers"] if c["name"] == "pytorch")
    assert trainer_status_server(c)


# --- the endpoint's CA from the webhook (--progress-push-ca-file): annotation + downward API ---


def _ca_pem() -> str:
    return make_ca("kubeckpt-progress-ca", now=NOW, validity=YEAR, backdate=HOUR).cert_pem.decode()


def _push_volume(p: dict) -> dict:
    return next(v for v in p["spec"]["volumes"] if v["name"] == PUSH_VOLUME)


def test_with_the_webhooks_ca_the_pod_reads_it_from_its_own_annotation() -> None:
    ca = _ca_pem()
    r = mutate(pod(), policy(progress={"push": True}), NS, push_ca=ca)
    assert r.pod["metadata"]["annotations"][PUSH_CA_ANNOTATION] == ca
    sa, source = _push_volume(r.pod)["projected"]["sources"]
    assert sa["serviceAccountToken"]["audience"] == PUSH_AUDIENCE
    assert source == {
        "downwardAPI": {
            "items": [
                {
                    "path": "ca.crt",
                    "fieldRef": {
                        "apiVersion": "v1",
                        "fieldPath": "metadata.annotations['kubeckpt.io/progress-push-ca']",
                    },
                }
            ]
        }
    }
    assert "configMap" not in json.dumps(_push_volume(r.pod))
    assert jsonpatch.apply_patch(pod(), r.patch) == r.pod  # the patch is what the server stores


def test_without_the_webhooks_ca_the_configmap_stays_and_nothing_is_stamped() -> None:
    r = mutate(pod(), policy(progress={"push": True}), NS, push_ca=None)
    assert PUSH_CA_ANNOTATION not in r.pod["metadata"]["annotations"]
    _, source = _push_volume(r.pod)["projected"]["sources"]
    assert source["configMap"] == {
        "name": "kubeckpt-progress-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
        "optional": True,
    }


def test_a_pod_without_push_gets_no_ca_annotation() -> None:
    r = mutate(pod(), policy(), NS, push_ca=_ca_pem())
    assert PUSH_CA_ANNOTATION not in r.pod["metadata"]["annotations"]


def test_a_tenants_own_ca_annotation_is_overwritten_and_not_an_override() -> None:
    ca = _ca_pem()
    theirs = _ca_pem()  # another CA: what a tenant would like its pod to trust
    p = pod()
    p["metadata"]["annotations"] = {PUSH_CA_ANNOTATION: theirs, "team": "a"}
    r = mutate(p, policy(progress={"push": True}), NS, push_ca=ca)
    assert r.pod["metadata"]["annotations"][PUSH_CA_ANNOTATION] == ca
    assert r.pod["metadata"]["annotations"]["team"] == "a"
    assert not any("progress-push-ca" in w for w in r.warnings)  # ours, not an unknown override
    assert jsonpatch.apply_patch(p, r.patch) == r.pod


def test_the_ca_is_not_stamped_when_the_push_volume_is_the_users() -> None:
    p = pod()
    p["spec"]["volumes"] = [{"name": PUSH_VOLUME, "emptyDir": {}}]
    r = mutate(p, policy(progress={"push": True}), NS, push_ca=_ca_pem())
    assert PUSH_CA_ANNOTATION not in r.pod["metadata"]["annotations"]
    assert f"volume/{PUSH_VOLUME}" in r.skipped


def test_the_ca_mutation_is_idempotent() -> None:
    ca = _ca_pem()
    first = mutate(pod(), policy(progress={"push": True}), NS, push_ca=ca)
    again = mutate(first.pod, policy(progress={"push": True}), NS, push_ca=_ca_pem())
    assert again.patch == [] and again.reason == "already injected"
    assert again.pod["metadata"]["annotations"][PUSH_CA_ANNOTATION] == ca
    assert [v["name"] for v in again.pod["spec"]["volumes"]].count(PUSH_VOLUME) == 1
