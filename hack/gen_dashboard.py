"""Write config/components/prometheus/dashboards/kubeckpt-training.json, the Grafana dashboard
of training jobs, from the panel list below.

Generated rather than hand-edited so that each query names metrics as the code declares them
(progress_controller/metrics.py); tests/unit/test_dashboard.py fails when the file is stale or a
query names a metric the reconciler does not export. Run after editing a panel:
    python hack/gen_dashboard.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "config" / "components" / "prometheus" / "dashboards" / "kubeckpt-training.json"
UID = "kubeckpt-training"
# The job selector every per-job query carries: the dashboard's two variables.
SEL = 'namespace=~"$namespace", job=~"$job"'
LEGEND = "{{namespace}}/{{job}}"

# (title, kind, unit, [(query, legend)], description); kind: timeseries, stat, table
PANELS: list[tuple[str, str, str, list[tuple[str, str]], str]] = [
    (
        "Running jobs",
        "stat",
        "none",
        [(f"count(kubeckpt_training_step{{{SEL}}})", "")],
        "Jobs the reconciler reads progress of.",
    ),
    (
        "Stalled jobs",
        "stat",
        "none",
        [(f"sum(kubeckpt_training_stalled{{{SEL}}})", "")],
        "Jobs with no step for longer than expected (TrainingProgress condition Stalled).",
    ),
    (
        "Failed checkpoint saves",
        "stat",
        "none",
        [(f"sum(kubeckpt_checkpoint_failed_saves{{{SEL}}})", "")],
        "Saves that failed in the jobs' current runs; `kubectl describe tp` says why.",
    ),
    (
        "Oldest checkpoint",
        "stat",
        "s",
        [(f"max(kubeckpt_seconds_since_last_checkpoint{{{SEL}}})", "")],
        "The longest any job has gone since its latest complete checkpoint: what a preemption "
        "now would cost it at most.",
    ),
    (
        "Progress",
        "timeseries",
        "percent",
        [(f"kubeckpt_training_percent_complete{{{SEL}}}", LEGEND)],
        "Percent of the run's steps done.",
    ),
    (
        "Step",
        "timeseries",
        "none",
        [(f"kubeckpt_training_step{{{SEL}}}", LEGEND)],
        "Current step; a drop is a resume from a checkpoint.",
    ),
    (
        "Loss",
        "timeseries",
        "none",
        [(f"kubeckpt_training_loss{{{SEL}}}", LEGEND)],
        "Latest loss the job reported.",
    ),
    (
        "Time remaining",
        "timeseries",
        "s",
        [(f"kubeckpt_training_eta_seconds{{{SEL}}}", LEGEND)],
        "The job's own estimate of the time left.",
    ),
    (
        "Time since last checkpoint",
        "timeseries",
        "s",
        [(f"kubeckpt_seconds_since_last_checkpoint{{{SEL}}}", LEGEND)],
        "Work a preemption now would lose, at most.",
    ),
    (
        "Seconds per step",
        "timeseries",
        "s",
        [(f"kubeckpt_training_step_seconds{{{SEL}}}", LEGEND)],
        "Recent average step time.",
    ),
    (
        "Checkpoint save and stall",
        "timeseries",
        "s",
        [
            (f"kubeckpt_checkpoint_save_seconds{{{SEL}}}", "save " + LEGEND),
            (f"kubeckpt_checkpoint_stall_seconds{{{SEL}}}", "stall " + LEGEND),
        ],
        "Save: seconds until the latest checkpoint was durable. Stall: seconds training was held "
        "up by it (an async save stalls only for the copy).",
    ),
    (
        "Jobs stalled now",
        "table",
        "none",
        [(f"kubeckpt_training_stalled{{{SEL}}} == 1", "")],
        "Each job now Stalled.",
    ),
]


def _panel(n: int, title: str, kind: str, unit: str, targets: list, desc: str) -> dict[str, Any]:
    # Four stats a row on top, then two panels a row.
    if kind == "stat":
        pos = {"h": 4, "w": 6, "x": 6 * (n % 4), "y": 0}
    else:
        k = n - 4
        pos = {"h": 8, "w": 12, "x": 12 * (k % 2), "y": 4 + 8 * (k // 2)}
    panel: dict[str, Any] = {
        "id": n + 1,
        "title": title,
        "description": desc,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": expr,
                "legendFormat": legend or "__auto",
                "refId": chr(ord("A") + i),
                **({"format": "table", "instant": True} if kind == "table" else {}),
            }
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "graphMode": "none"}
    return panel


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "kubeckpt: training jobs",
        "description": "Progress, loss, time left and checkpoint health of training jobs, from "
        "kubeckpt's reconciler (config/prometheus).",
        "tags": ["kubeckpt", "training"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable(
                    "namespace", "Namespace", "label_values(kubeckpt_training_step, namespace)"
                ),
                _variable(
                    "job",
                    "Job",
                    'label_values(kubeckpt_training_step{namespace=~"$namespace"}, job)',
                ),
            ]
        },
        "panels": [_panel(n, *p) for n, p in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def queries() -> list[str]:
    """The PromQL expressions of the panels (with the variables still in them)."""
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def variable_queries() -> list[str]:
    """The variables' Grafana queries (`label_values(<PromQL selector>, label)`)."""
    return [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(REPO)}", file=sys.stderr)
