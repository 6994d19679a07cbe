"""Which TrainingProgress is a job's (spec.jobRef, never the name alone), and the name a new one
gets."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB, TRAINJOB
from kubeckpt_api.status_identity import (
    MAX_NAME_LENGTH,
    is_progress_of,
    job_ref,
    owner_uid,
    progress_names,
    progress_of,
)

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def tp(name: str, kind: str, job: str, uid: str | None = None, api: str | None = None) -> dict:
    api = api or ("kubeflow.org/v1" if kind == "PyTorchJob" else "trainer.kubeflow.org/v1alpha1")
    md: dict = {"name": name, "namespace": "ns"}
    if uid:
        md["ownerReferences"] = [
            {"apiVersion": api, "kind": kind, "name": job, "uid": uid, "controller": True}
        ]
    return {"metadata": md, "spec": {"jobRef": {"apiVersion": api, "kind": kind, "name": job}}}


def test_the_job_ref_decides_not_the_name() -> None:
    pt = tp("llama", "PyTorchJob", "llama", "u1")
    tj = tp("llama-trainjob", "TrainJob", "llama", "u2")
    assert job_ref(pt) == (PYTORCHJOB, "llama") and job_ref(tj) == (TRAINJOB, "llama")
    assert is_progress_of(tj, TRAINJOB, "llama") and not is_progress_of(tj, PYTORCHJOB, "llama")
    assert progress_of([pt, tj], TRAINJOB, "llama") == [tj]
    assert progress_of([pt, tj], PYTORCHJOB, "llama") == [pt]
    assert owner_uid(tj) == "u2" and owner_uid(tp("x", "TrainJob", "x")) is None


def test_a_job_ref_of_another_group_or_an_unknown_kind_is_no_ones() -> None:
    assert job_ref(tp("llama", "PyTorchJob", "llama", api="evil.example.com/v1")) is None
    assert job_ref(tp("llama", "MPIJob", "llama", api="kubeflow.org/v2beta1")) is None
    assert job_ref({"metadata": {"name": "x"}}) is None
    assert job_ref({"spec": {"jobRef": "llama"}}) is None


def test_the_jobs_own_progress_comes_first() -> None:
    stale = tp("llama", "PyTorchJob", "llama", "old-uid")
    mine = tp("llama-pytorchjob", "PyTorchJob", "llama", "new-uid")
    assert progress_of([stale, mine], PYTORCHJOB, "llama", "new-uid") == [mine, stale]
    assert progress_of([stale, mine], PYTORCHJOB, "llama", "old-uid") == [stale, mine]


def test_names_the_first_job_keeps_the_plain_one() -> None:
    assert progress_names("llama", TRAINJOB, "1b2c3d4e-aaaa-bbbb") == [
        "llama",
        "llama-trainjob",
        "llama-trainjob-1b2c3d4e",
    ]
    assert progress_names("llama", PYTORCHJOB, "ffff")[1] == "llama-pytorchjob"


@given(
    name=st.from_regex(DNS_SUBDOMAIN, fullmatch=True).filter(lambda n: len(n) <= MAX_NAME_LENGTH),
    uid=st.uuids().map(str),
    kind=st.sampled_from(JOB_KINDS),
)
def test_every_name_is_a_valid_object_name_and_they_differ(name: str, uid: str, kind) -> None:
    names = progress_names(name, kind, uid)
    assert names[0] == name and len(set(names)) == len(names) >= 2
    for n in names:
        assert len(n) <= MAX_NAME_LENGTH and DNS_SUBDOMAIN.fullmatch(n), n
