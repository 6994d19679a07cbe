"""progress.push: the webhook injects the push URL, a projected token of our audience and the CA;
Trainer's own status server, when configured on the pod, is kept."""

from __future__ import annotations

from progress_controller.push_auth import PUSH_AUDIENCE
from progress_controller.trainjob import trainer_status_server
from tests.unit.webhook.test_mutation import NS, env_of, pod, policy
from webhook.mutation import mutate

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
