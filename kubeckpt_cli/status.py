"""`kubeckpt status [JOB]`: the jobs' progress from their TrainingProgress objects, once."""

from __future__ import annotations

import sys
from typing import TextIO

from .cluster import Cluster
from .output import dump, status_document, status_table
from .view import job_view, now_utc


async def status(
    cluster: Cluster,
    namespace: str | None,
    job: str | None,
    fmt: str,
    out: TextIO = sys.stdout,
    *,
    kind: str | None = None,
) -> int:
    """Print the table (or JSON/YAML). `namespace` None means all namespaces; `kind` keeps the
    jobs of that kind (and picks one of same-named jobs)."""
    if job is not None:
        assert namespace is not None
        views = [job_view(await cluster.find_progress(job, namespace, kind))]
    else:
        items, _ = await cluster.list_progress(namespace)
        views = [v for v in (job_view(tp) for tp in items) if kind in (None, v.kind)]
    now = now_utc()
    if fmt == "table":
        if not views:
            where = f'namespace "{namespace}"' if namespace else "any namespace"
            print(f"No training jobs found in {where}.", file=sys.stderr)
        else:
            print(status_table(views, now, all_namespaces=namespace is None), file=out)
    else:
        print(dump(status_document(views, now, single=job is not None), fmt), file=out)
    return 0
