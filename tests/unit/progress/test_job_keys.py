"""The controller's job keys: they carry the kind, so same-named jobs of two kinds never share a
key (a TrainingProgress, state, Events); a PyTorchJob's key is "ns/name" as it always was."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB
from progress_controller import discovery as d


def tp(name: str, kind: str, job: str) -> dict:
    api = "kubeflow.org/v1" if kind == "PyTorchJob" else "trainer.kubeflow.org/v1alpha1"
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"jobRef": {"apiVersion": api, "kind": kind, "name": job}},
    }


@given(
    ns=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
    name=st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?", fullmatch=True),
    kind=st.sampled_from(JOB_KINDS),
)
def test_job_keys_round_trip_and_never_meet_across_kinds(ns: str, name: str, kind) -> None:
    key = d.job_key(kind, ns, name)
    assert d.parse_job_key(key) == (kind, ns, name)
    others = {d.job_key(k, ns, name) for k in JOB_KINDS if k is not kind}
    assert key not in others
    assert d.job_key(PYTORCHJOB, ns, name) == f"{ns}/{name}"  # as it always was


def test_pod_and_progress_keys_agree() -> None:
    pod = {
        "metadata": {
            "namespace": "ns",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "llama",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
            },
        }
    }
    progress = tp("llama-trainjob", "TrainJob", "llama")
    assert d.pod_job_key(pod) == d.progress_job_key(progress) == "ns/_trainjob/llama"
    assert d.parse_job_key("ns/_nosuchkind/llama") is None
    assert d.parse_job_key("ns/") is None
