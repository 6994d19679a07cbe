"""Output formats: a kubectl-style table (plain, aligned, never wrapped, so scripts and `grep` see
one row per line whatever the terminal width), JSON and YAML."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import yaml

from .view import JobView, age, clean

FORMATS = ("table", "json", "yaml")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns separated by three spaces, as `kubectl get` prints them; cells are cleaned."""
    cells = [[clean(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    lines = []
    for row in [list(headers), *cells]:
        parts = [c.ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("   ".join(parts).rstrip())
    return "\n".join(lines)


def dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False, default=str)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


STATUS_HEADERS = ("NAME", "KIND", "STATE", "STEP", "PERCENT", "LOSS", "ETA", "CHECKPOINT", "SAVED")


def status_rows(views: Sequence[JobView], now: datetime, all_namespaces: bool) -> list[list[str]]:
    rows = []
    for v in views:
        row = [
            v.name,
            v.kind,
            v.state,
            v.step_text(),
            v.percent_text(),
            v.loss or "-",
            v.eta or "-",
            v.checkpoint_text(),
            age(v.latest_checkpoint_time, now) + (" ago" if v.latest_checkpoint_time else ""),
        ]
        rows.append([v.namespace, *row] if all_namespaces else row)
    return rows


def status_table(views: Sequence[JobView], now: datetime, all_namespaces: bool) -> str:
    headers = ("NAMESPACE", *STATUS_HEADERS) if all_namespaces else STATUS_HEADERS
    return table(headers, status_rows(views, now, all_namespaces))


def status_document(views: Sequence[JobView], now: datetime, single: bool) -> Any:
    """One object for `status JOB`, a list object otherwise (as `kubectl get` does)."""
    items = [v.to_dict(now) for v in views]
    if single:
        return items[0]
    return {"kind": "JobStatusList", "items": items}
