"""Kueue preempts for real (issue 25's scenario, `make demo DEMO_ARGS=--kueue`, with assertions):
the real Kueue (built from its module) admits a low-priority PyTorchJob to a ClusterQueue with
room for one job; a high-priority job arrives; Kueue evicts the low one by suspending it; the
training-operator deletes its pods and the injected preStop saves a just-in-time checkpoint on
both ranks; the TrainingProgress says Suspended while the high job runs to completion; Kueue
readmits the low job, which resumes at exactly the saved step on every rank and ends bitwise equal
to an uninterrupted copy, with JITCheckpoint and Resumed Events once each."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import demo_kueue
import pytest

from localcluster import LocalCluster
from localcluster import addon as kubeckpt_addon
from localcluster.binaries import MissingBinaries
from localcluster.node import RealNode

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    try:
        cluster.start_kueue()
    except MissingBinaries as e:
        pytest.fail(f"{e}\nBuild Kueue with hack/build-binaries.sh.", pytrace=False)
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)
        cluster.stop_kueue()


def test_kueue_preempts_kubeckpt_saves_and_the_job_resumes_exactly(
    cluster: LocalCluster, addon: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(fast=True, reference=True, keep=False)
    rc = demo_kueue.run(args, tmp_path, cluster)
    out = capsys.readouterr().out
    assert rc == 0, out[-8000:]
    assert "PASS: kubeckpt demo" in out
    assert "[FAILED]" not in out, out[-8000:]
    assert "Workload condition Evicted: Preempted" in out, out[-8000:]
    # What the scenario checked, named here so that a silent change of its checks shows.
    for what in (
        "the TrainingProgress says Suspended, evicted by Kueue, while it waits",
        "it names the preemptor, PyTorchJob demo/urgent",
        "the high-priority job finished at step",
        "both ranks resumed at exactly one step",
        "no step lost",
        "the just-in-time checkpoint is complete on the volume",
        "final parameters bitwise equal to the uninterrupted run's",
        "Events JITCheckpoint x1, Resumed x1",
        "kubectl describe tp lists the JITCheckpoint and Resumed Events",
    ):
        assert what in out, what
