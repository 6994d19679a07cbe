"""`kubeckpt checkpoints JOB --storage PATH`: list a job's checkpoints from a local path.

For storage mounted here (a PVC mounted on this machine, an NFS export, a copy): no cluster
needed. PATH is either the policy's storage root (what `pvc://CLAIM/path` names: the CLI appends
the job's directory, `<namespace>/<job>` for a PyTorchJob, `<namespace>/_trainjob/<job>` for a
TrainJob) or the job's own directory. Which one is told by what is there: PATH/<job's directory>
exists, or PATH itself holds checkpoints (or generations), or is named after the job. Both, or
neither: an error that says what was looked for.

The listing is the very function the rank-0 pod and the lister pod run
(`trainer_runtime.listing.listing`), so the table, its states and REASONs are the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubeckpt_api.jobkinds import JobKind
from trainer_runtime import listing
from trainer_runtime.contract import parse_checkpoint_dir_name, parse_generation_dir_name

from .errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError
from .view import clean

MAX_PEEK = 10_000  # entries of PATH looked at to tell a job's directory


def _holds_checkpoints(path: Path) -> bool:
    """Whether `path` looks like a job's directory: a checkpoint or a generation in it."""
    try:
        for i, entry in enumerate(path.iterdir()):
            if i >= MAX_PEEK:
                break
            name = entry.name
            if parse_checkpoint_dir_name(name) is not None or parse_generation_dir_name(name):
                return True
    except OSError:
        return False
    return False


def job_root(path: str, namespace: str, job: str, kinds: Iterable[JobKind]) -> Path:
    """The job's checkpoint directory for `--storage PATH` (see the module's docstring)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise CliError(f"--storage {clean(path)}: not a directory", EXIT_NOT_FOUND)
    below = [(k, root / k.storage_dir(namespace, job)) for k in kinds]
    below = [(k, p) for k, p in below if p.is_dir()]
    itself = _holds_checkpoints(root) or root.name == job
    if len(below) > 1:
        names = ", ".join(k.kind for k, _ in below)
        raise CliError(
            f'--storage {clean(path)} holds a directory for "{clean(job)}" of several kinds '
            f"({names}): choose one with --kind",
            EXIT_USAGE,
        )
    if below and itself:
        raise CliError(
            f"--storage {clean(path)} is ambiguous: it holds checkpoints itself and "
            f"{clean(below[0][1])}: give the job's directory itself"
        )
    if below:
        return below[0][1]
    if itself:
        return root
    looked = " or ".join(sorted({k.storage_dir(namespace, job) for k in kinds}))
    raise CliError(
        f'--storage {clean(path)}: no checkpoints of "{clean(job)}" there: give the policy\'s '
        f"storage root (holding {clean(looked)}; check -n and --kind) or the job's own directory",
        EXIT_NOT_FOUND,
    )


def list_local(
    path: Path, *, max_entries: int, max_bytes: int, verify: bool = False
) -> dict[str, Any]:
    """The listing document of the job directory `path` (persistent tier only: a ramdisk tier
    is on the node and went with the pods), through the pods' rendering too (ASCII JSON within
    `max_bytes`), so that hostile names reach the terminal as the pods' listings do. `verify`:
    each checkpoint's content checked too (`--verify`)."""
    doc = listing.listing(str(path), None, max_entries=max_entries, content=verify)
    return json.loads(listing.render(doc, max_bytes))
