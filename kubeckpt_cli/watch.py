"""`kubeckpt status --watch`: a live table with a progress bar per job.

The TrainingProgress objects are followed with a list-then-watch (a 410 relists; a dropped stream
reconnects after a short pause, saying so in the footer), and the screen is redrawn from the
asyncio loop at each change and once a second (ages move on), with rich's `Live`, which
repaints in place and restores the cursor on exit. No refresh thread: the state it draws is
only touched by the loop. Ctrl-C ends it with exit code 0. Without a terminal (a pipe), each
change prints the plain table again instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from datetime import datetime
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reconciler.errors import Gone, KubeError

from .cluster import TP_RESOURCE, Cluster
from .errors import CliError, translate
from .output import status_table
from .view import JobView, age, clean, job_view, now_utc

STATE_STYLES = {
    "Training": "green",
    "Succeeded": "bold green",
    "Failed": "bold red",
    "Stalled": "yellow",
    "Suspended": "cyan",
    "Pending": "dim",
    "Unknown": "magenta",
}
RECONNECT_SECONDS = 2.0
BAR_MIN, BAR_MAX = 10, 40
GAP = 2  # rich's cell padding between two columns


def bar(fraction: float | None, width: int = BAR_MAX, unicode: bool = True) -> str:
    """`fraction` (0..1) as a bar of `width` cells: filled, then empty (ASCII without UTF-8)."""
    full, empty = ("\u2588", "\u2591") if unicode else ("#", "-")
    if fraction is None:
        return empty * width
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return full * filled + empty * (width - filled)


class WatchState:
    """The latest object of each job, keyed by (namespace, name), and the connection's health;
    `kind` shows only that kind's jobs."""

    def __init__(self, kind: str | None = None) -> None:
        self.kind = kind
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.problem: str | None = None
        self.changed = asyncio.Event()

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.items = {_key(o): o for o in items}
        self.problem = None
        self.changed.set()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.items.pop(_key(obj), None)
        elif kind in ("ADDED", "MODIFIED"):
            self.items[_key(obj)] = obj
        else:
            return  # BOOKMARK
        self.changed.set()

    def views(self) -> list[JobView]:
        views = (job_view(self.items[k]) for k in sorted(self.items))
        return [v for v in views if self.kind in (None, v.kind)]


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


async def follow(
    cluster: Cluster, namespace: str | None, name: str | None, state: WatchState
) -> None:
    """Keep `state` current until cancelled. API errors that retrying cannot fix (forbidden, the
    CRD gone) end it with a CliError; a lost connection is retried."""
    res = await cluster.tp_resource(namespace)
    api = cluster.client.api(res)
    selector = f"metadata.name={name}" if name else None
    rv: str | None = None
    while True:
        try:
            if rv is None:
                items, rv = await cluster.list_progress(namespace, name)
                state.replace(items)
            async with contextlib.aclosing(
                api.watch(namespace, resource_version=rv, field_selector=selector)
            ) as events:
                async for event in events:
                    state.apply(event.type, event.object)
                    rv = (event.object.get("metadata") or {}).get("resourceVersion") or rv
                    state.problem = None
        except Gone:
            rv = None  # too old: list again
            continue
        except CliError as e:
            if not e.transient:
                raise
            state.problem = "connection lost, retrying"
        except KubeError as e:
            err = translate(e, "watch", TP_RESOURCE, namespace, cluster.target.server)
            if not err.transient:
                raise err from None
            state.problem = "connection lost, retrying"
        else:
            # The server ended the watch (its timeout): resume from rv, after a breath in case
            # it ends every watch at once.
            await asyncio.sleep(0.5)
            continue
        state.changed.set()
        rv = None
        await asyncio.sleep(RECONNECT_SECONDS)


# Dropped in this order when the terminal is too narrow for them and a bar of BAR_MIN cells.
OPTIONAL = ("CHECKPOINT", "ETA", "LOSS", "SAVED")


def _cells(v: JobView, now: datetime, all_namespaces: bool) -> dict[str, str]:
    cells = {
        "NAME": clean(v.name, 63),
        "STATE": v.state,
        "STEP": v.step_text(),
        "PERCENT": v.percent_text(),
        "LOSS": clean(v.loss or "-", 20),
        "ETA": clean(v.eta or "-", 20),
        "CHECKPOINT": v.checkpoint_text(),
        "SAVED": f"{age(v.latest_checkpoint_time, now)} ago" if v.latest_checkpoint_time else "-",
    }
    if all_namespaces:
        cells["NAMESPACE"] = clean(v.namespace, 63)
    return cells


def layout(rows: list[dict[str, str]], width: int, all_namespaces: bool) -> tuple[list[str], int]:
    """The columns that fit `width` beside the bar, and the bar's width (BAR_MIN..BAR_MAX)."""
    columns = ["NAMESPACE"] if all_namespaces else []
    columns += ["NAME", "STATE", "PROGRESS", "STEP", "PERCENT", "LOSS", "ETA", "CHECKPOINT"]
    columns.append("SAVED")

    def others(cols: list[str]) -> int:
        widths = [max([len(c)] + [len(r[c]) for r in rows]) for c in cols if c != "PROGRESS"]
        return sum(widths) + GAP * (len(cols) - 1)

    for drop in OPTIONAL:
        if others(columns) + BAR_MIN <= width:
            break
        columns.remove(drop)
    return columns, max(BAR_MIN, min(BAR_MAX, width - others(columns)))


def render(
    views: list[JobView],
    now: datetime,
    *,
    all_namespaces: bool,
    unicode: bool,
    problem: str | None,
    waiting_for: str | None,
    width: int = 120,
) -> Group:
    """One frame: the table (as many columns as `width` allows, the bar taking the rest) and a
    footer with the time and the connection's trouble, if any."""
    rows = [_cells(v, now, all_namespaces) for v in views]
    columns, bar_width = layout(rows, width, all_namespaces)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for v, cells in zip(views, rows, strict=True):
        style = STATE_STYLES.get(v.state, "")
        line = []
        for column in columns:
            if column == "PROGRESS":
                line.append(Text(bar(v.fraction, bar_width, unicode=unicode), style=style))
            else:
                line.append(Text(cells[column], style=style if column == "STATE" else ""))
        table.add_row(*line)
    footer = Text(f"{now.astimezone():%H:%M:%S}  Ctrl-C to exit", style="dim")
    if problem:
        footer.append(f"  {problem}", style="yellow")
    parts: list[Any] = [table] if views else []
    if not views:
        parts.append(Text(f"waiting for {waiting_for}" if waiting_for else "no training jobs"))
    parts.append(footer)
    return Group(*parts)


async def watch(
    cluster: Cluster,
    namespace: str | None,
    job: str | None,
    *,
    kind: str | None = None,
    console: Console | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Follow the jobs until Ctrl-C (the caller maps the KeyboardInterrupt to exit code 0)."""
    progress_name = None
    if job is not None:
        assert namespace is not None
        # A typo fails now, not as an endless wait; the job's TrainingProgress may be named
        # otherwise than the job (`llama-trainjob`), so its own name is what is watched.
        tp = await cluster.find_progress(job, namespace, kind)
        progress_name = str(tp["metadata"]["name"])
    console = console or Console(file=out)
    state = WatchState(kind)
    follower = asyncio.create_task(follow(cluster, namespace, progress_name, state))
    try:
        if console.is_terminal:
            await _live(console, state, follower, namespace is None, job)
        else:
            await _plain(state, follower, namespace is None, out)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    return 0


async def _next_change(
    state: WatchState,
    follower: asyncio.Task[None],
    timeout: float | None,  # noqa: ASYNC109 - a redraw tick, not a deadline
) -> None:
    """Wait for a change (or `timeout`); re-raise the follower's error if it ended."""
    waiter = asyncio.ensure_future(state.changed.wait())
    done, _ = await asyncio.wait({waiter, follower}, timeout=timeout, return_when="FIRST_COMPLETED")
    waiter.cancel()
    if follower in done:
        follower.result()  # raises its CliError
    state.changed.clear()


async def _live(
    console: Console,
    state: WatchState,
    follower: asyncio.Task[None],
    all_namespaces: bool,
    job: str | None,
) -> None:
    unicode = console.encoding.lower().startswith("utf")

    def frame() -> Group:
        return render(
            state.views(),
            now_utc(),
            all_namespaces=all_namespaces,
            unicode=unicode,
            problem=state.problem,
            waiting_for=job,
            width=console.width,
        )

    with Live(frame(), console=console, auto_refresh=False, transient=False) as live:
        while True:
            await _next_change(state, follower, timeout=1.0)
            live.update(frame(), refresh=True)


async def _plain(
    state: WatchState, follower: asyncio.Task[None], all_namespaces: bool, out: TextIO
) -> None:
    last = ""
    while True:
        await _next_change(state, follower, timeout=None)
        text = status_table(state.views(), now_utc(), all_namespaces)
        if text != last:
            print(text, file=out, flush=True)
            last = text
