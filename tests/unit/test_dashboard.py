"""The monitoring install (config/prometheus): the Grafana dashboard is current, names only metrics
the reconciler exports, ships with the sidecar's label, and the ServiceMonitor selects the metrics
Service's port. The live scrape and the queries run in tests/node/test_prometheus_on_node.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from gen_dashboard import OUT, queries, render, variable_queries

from progress_controller.metrics import CONTROLLER_COUNTERS, JOB_GAUGES, LABELS, job_samples

REPO = Path(__file__).resolve().parents[2]
EXPORTED = set(JOB_GAUGES) | {f"{name}_total" for name in CONTROLLER_COUNTERS}


def test_dashboard_file_is_current() -> None:
    assert OUT.read_text() == render(), "stale: run `python hack/gen_dashboard.py`"


def test_dashboard_queries_name_only_exported_metrics() -> None:
    used = {m for q in queries() + variable_queries() for m in re.findall(r"kubeckpt_\w+", q)}
    assert used, queries()
    assert used <= EXPORTED, f"not exported by the reconciler: {sorted(used - EXPORTED)}"
    # Every per-job query selects with the labels the gauges carry.
    for q in queries():
        for label in re.findall(r"(\w+)=~", q):
            assert label in LABELS, q


def test_every_issue_panel_is_there() -> None:
    """What users asked to see: progress, loss, ETA, time since last checkpoint, save and stall
    seconds, stalled jobs."""
    used = " ".join(queries())
    for name in (
        "kubeckpt_training_percent_complete",
        "kubeckpt_training_loss",
        "kubeckpt_training_eta_seconds",
        "kubeckpt_seconds_since_last_checkpoint",
        "kubeckpt_checkpoint_save_seconds",
        "kubeckpt_checkpoint_stall_seconds",
        "kubeckpt_training_stalled",
    ):
        assert name in used, name


def test_job_samples_from_a_status() -> None:
    status = {
        "step": 40,
        "totalSteps": 100,
        "percentComplete": "40.0",
        "loss": "0.2500",
        "stepSeconds": "0.5",
        "estimatedTimeRemaining": "1m30s",
        "conditions": [{"type": "Stalled", "status": "True"}],
        "checkpointing": {
            "checkpointsCreated": 3,
            "latestCheckpointTime": "2026-01-01T00:00:00Z",
            "lastSaveSeconds": "1.5",
            "lastStallSeconds": "0.002",
            "failedSaves": 1,
        },
    }
    now = 1767225600.0 + 90  # 2026-01-01T00:01:30Z
    assert job_samples(status, now) == {
        "kubeckpt_training_step": 40.0,
        "kubeckpt_training_total_steps": 100.0,
        "kubeckpt_training_percent_complete": 40.0,
        "kubeckpt_training_loss": 0.25,
        "kubeckpt_training_step_seconds": 0.5,
        "kubeckpt_training_eta_seconds": 90.0,
        "kubeckpt_training_stalled": 1.0,
        "kubeckpt_seconds_since_last_checkpoint": 90.0,
        "kubeckpt_checkpoints_created": 3.0,
        "kubeckpt_checkpoint_save_seconds": 1.5,
        "kubeckpt_checkpoint_stall_seconds": 0.002,
        "kubeckpt_checkpoint_failed_saves": 1.0,
    }
    # A fresh job: no value is made up; Stalled is there (0) so that sum() says 0, not nothing.
    assert job_samples({"step": 0, "loss": "nan?", "estimatedTimeRemaining": "soon"}, now) == {
        "kubeckpt_training_step": 0.0,
        "kubeckpt_training_stalled": 0.0,
    }


def _render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH: install it, or run `make binaries` and add its path"
    proc = subprocess.run(
        [kubectl, "kustomize", str(REPO / "config" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_prometheus_overlay_wires_the_metrics_service() -> None:
    docs = _render("prometheus")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    # Everything of config/default is there too.
    assert {(d["kind"], d["metadata"]["name"]) for d in _render("default")} <= set(by)

    cm = by["ConfigMap", "kubeckpt-grafana-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "kubeckpt-system"
    assert json.loads(cm["data"]["kubeckpt-training.json"]) == json.loads(OUT.read_text())

    sm = by["ServiceMonitor", "kubeckpt-reconciler"]
    svc = by["Service", "kubeckpt-reconciler-metrics"]
    spec = sm["spec"]
    assert svc["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
    assert spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # The webhook's Service is not scraped by it (it has its own component label).
    webhook = by["Service", "kubeckpt-webhook"]
    assert not spec["selector"]["matchLabels"].items() <= webhook["metadata"]["labels"].items()
    (ep,) = spec["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["scheme"] == "https" and ep["honorLabels"] is True

    binding = by["ClusterRoleBinding", "kubeckpt-metrics-reader-prometheus"]
    assert binding["roleRef"]["name"] == "kubeckpt-metrics-reader"
    assert ("ClusterRole", "kubeckpt-metrics-reader") in by
