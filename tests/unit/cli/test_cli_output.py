"""The `kubeckpt` CLI without a cluster: what it derives from a TrainingProgress, how it formats
tables, JSON, the live view and checkpoint listings, how it words errors, and its usage rules."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from kubeckpt_cli import checkpoints as ck
from kubeckpt_cli.describe import _progress_lines, injected_settings
from kubeckpt_cli.errors import EXIT_NOT_FOUND, translate
from kubeckpt_cli.main import main
from kubeckpt_cli.output import dump, status_document, status_table, table
from kubeckpt_cli.view import age, clean, human_bytes, job_view
from kubeckpt_cli.watch import bar, render
from reconciler.errors import ResourceNotFound, TransportError, api_error
from tests.support.cli_objects import condition, injected_pod, run_cli, tp, training_status
from trainer_runtime import listing
from trainer_runtime.contract import build_manifest
from trainer_runtime.storage import LocalTier

NOW = datetime(2026, 3, 1, 12, 5, 0, tzinfo=UTC)  # five minutes after the objects' times


@pytest.mark.parametrize(
    ("conditions", "step", "state"),
    [
        ([condition("Progressing", "True", "StepAdvanced")], 5, "Training"),
        (
            [
                condition("Progressing", "True", "StepAdvanced"),
                condition("Stalled", "True", "NoProgress"),
            ],
            5,
            "Stalled",
        ),
        ([condition("Progressing", "False", "Suspended")], 5, "Suspended"),
        ([condition("Completed", "True", "JobSucceeded")], 100, "Succeeded"),
        ([condition("Completed", "False", "JobFailed")], 40, "Failed"),
        ([condition("Progressing", "Unknown", "NoRank0Pod")], None, "Pending"),
        ([condition("Progressing", "Unknown", "ProgressFileInvalid")], 5, "Unknown"),
        ([], None, "Pending"),
    ],
)
def test_state_is_derived_from_conditions_without_status_state(conditions, step, state) -> None:
    status = {"conditions": conditions}
    if step is not None:
        status["step"] = step
    assert job_view(tp("j", "ns", status=status)).state == state


def test_status_state_wins_when_the_controller_wrote_one() -> None:
    status = {
        "state": "Suspended",
        "conditions": [condition("Progressing", "True", "StepAdvanced")],
    }
    assert job_view(tp("j", "ns", status=status)).state == "Suspended"
    status["state"] = "Bogus"  # not a state this CLI knows: derive it instead
    assert job_view(tp("j", "ns", status=status)).state == "Training"


def test_progress_fraction_and_text() -> None:
    v = job_view(tp("j", "ns", status=training_status(30)))
    assert (v.fraction, v.step_text(), v.percent_text()) == (0.3, "30/100", "30.0%")
    no_percent = training_status(25, total=50)
    del no_percent["percentComplete"]
    assert job_view(tp("j", "ns", status=no_percent)).fraction == 0.5
    bare = job_view(tp("j", "ns", status={"step": 7}))
    assert (bare.fraction, bare.step_text(), bare.percent_text()) == (None, "7", "-")
    assert job_view(tp("j", "ns")).step_text() == "-"
    odd = job_view(tp("j", "ns", status={"percentComplete": "nan", "step": True}))
    assert odd.fraction is None and odd.step is None


def test_ages_and_sizes_read_like_kubectl() -> None:
    assert age(NOW - timedelta(seconds=45), NOW) == "45s"
    assert age(NOW - timedelta(minutes=12), NOW) == "12m"
    assert age(NOW - timedelta(hours=5), NOW) == "5h"
    assert age(NOW - timedelta(days=3), NOW) == "3d"
    assert age(None, NOW) == "-"
    assert age(NOW + timedelta(minutes=1), NOW) == "0s"  # a clock ahead of ours
    assert [human_bytes(n) for n in (None, 12, 2048, 5 * 2**30)] == [
        "-",
        "12 B",
        "2.0 KiB",
        "5.0 GiB",
    ]


def test_terminal_control_characters_never_reach_the_screen() -> None:
    assert clean("a\x1b[2Jb\nc\x07d\u202ee") == "a?[2Jb?c?d?e"
    assert clean("x" * 300, 10) == "xxxxxxx..."
    assert clean("\udcff") == "?"  # a lone surrogate (undecodable bytes) would crash printing


def test_status_table_namespaced_and_all_namespaces() -> None:
    a = tp("llama", "team-a", status=training_status(30))
    b = tp("bert", "team-b", kind="TrainJob", status={"conditions": []})
    views = [job_view(a), job_view(b)]
    lines = status_table(views, NOW, all_namespaces=False).splitlines()
    assert lines[0].split() == [
        "NAME",
        "KIND",
        "STATE",
        "STEP",
        "PERCENT",
        "LOSS",
        "ETA",
        "CHECKPOINT",
        "SAVED",
    ]
    assert lines[1].split() == [
        "llama",
        "PyTorchJob",
        "Training",
        "30/100",
        "30.0%",
        "0.0323",
        "5m",
        "checkpoint-30",
        "5m",
        "ago",
    ]
    assert lines[2].split() == ["bert", "TrainJob", "Pending", "-", "-", "-", "-", "-", "-"]
    # columns line up: every row's STATE starts where the header's does
    col = lines[0].index("STATE")
    assert all(line[col:].startswith(("STATE", "Training", "Pending")) for line in lines)
    wide = status_table(views, NOW, all_namespaces=True).splitlines()
    assert wide[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert wide[1].split()[:2] == ["team-a", "llama"]


def test_status_documents_for_one_job_and_for_a_list() -> None:
    v = job_view(tp("llama", "team-a", status=training_status(30)))
    one = status_document([v], NOW, single=True)
    assert one["name"] == "llama" and one["state"] == "Training"
    assert one["step"] == 30 and one["percentComplete"] == 30.0
    assert one["latestCheckpointAgeSeconds"] == 300
    assert one["latestCheckpointReason"] == "periodic"
    many = status_document([v, v], NOW, single=False)
    assert many["kind"] == "JobStatusList" and len(many["items"]) == 2
    assert json.loads(dump(many, "json")) == many
    assert yaml.safe_load(dump(one, "yaml")) == one


LIFETIME = {
    "incarnation": "c",
    "incarnationCheckpoints": 1,
    "checkpointsCreated": 6,
    "interruptions": 2,
    "resumes": 2,
    "stepsLost": 7,
    "secondsLost": "174.0",
    "lastInterruption": {
        "time": "2026-03-01T12:00:00Z",
        "lastStep": 52,
        "resumedStep": 50,
        "stepsLost": 2,
        "downtimeSeconds": "60.0",
        "secondsLost": "64.0",
    },
}


def test_describe_and_status_show_the_counts_over_the_jobs_life() -> None:
    status = training_status(30, lifetime=LIFETIME)
    status["checkpointing"]["checkpointsCreated"] = 6
    v = job_view(tp("llama", "team-a", status=status))
    lines = _progress_lines(v, status, NOW)
    assert "Interruptions: 2 (2 resumed from a checkpoint)" in lines
    assert "Lost:          7 steps, 174 s (last: 2 steps, 64 s at 2026-03-01T12:00:00Z)" in lines
    assert "  Created:     6 over the job's life, 1 by this process" in lines
    doc = status_document([v], NOW, single=True)
    assert (doc["checkpointsCreated"], doc["interruptions"], doc["resumes"]) == (6, 2, 2)
    assert (doc["stepsLost"], doc["secondsLost"]) == (7, 174.0)


def test_describe_shows_no_interruptions_line_for_a_job_never_interrupted() -> None:
    status = training_status(30)
    lines = _progress_lines(job_view(tp("llama", "team-a", status=status)), status, NOW)
    assert not any(line.startswith(("Interruptions:", "Lost:")) for line in lines)
    assert "  Created:     2 over the job's life" in lines


def test_a_spoiled_lifetime_is_shown_as_unknown_not_raised() -> None:
    spoiled = {"interruptions": 1, "secondsLost": "-5", "lastInterruption": {"stepsLost": "x"}}
    status = training_status(30, lifetime=spoiled)
    lines = _progress_lines(job_view(tp("llama", "team-a", status=status)), status, NOW)
    assert "Lost:          0 steps, ? s (last: ? steps, ? s)" in lines


def test_bar_fills_in_proportion() -> None:
    assert bar(0.0, 10) == "\u2591" * 10
    assert bar(0.5, 10) == "\u2588" * 5 + "\u2591" * 5
    assert bar(1.5, 10) == "\u2588" * 10
    assert bar(None, 4, unicode=False) == "----"
    assert bar(0.25, 4, unicode=False) == "#---"


def frame_text(views, width: int, **kw) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    options = {"all_namespaces": False, "unicode": True, "problem": None, "waiting_for": None}
    console.print(render(views, NOW, width=width, **(options | kw)))
    return console.file.getvalue()  # type: ignore[attr-defined]


def bar_cells(row: str) -> tuple[int, int]:
    return row.count("\u2588"), row.count("\u2588") + row.count("\u2591")


def test_live_frame_shows_a_bar_per_job_and_the_footer() -> None:
    views = [
        job_view(tp("llama", "a", status=training_status(30))),
        job_view(tp("bert", "b", status=training_status(90, state="Stalled"))),
    ]
    text = frame_text(views, 200, all_namespaces=True, problem="connection lost")
    lines = text.splitlines()
    assert lines[0].split() == [
        *"NAMESPACE NAME STATE PROGRESS STEP PERCENT LOSS ETA CHECKPOINT SAVED".split()
    ]
    rows = {line.split()[1]: line for line in lines if line.startswith(("a ", "b "))}
    assert bar_cells(rows["llama"]) == (12, 40) and "Training" in rows["llama"]
    assert bar_cells(rows["bert"]) == (36, 40) and "Stalled" in rows["bert"]
    assert "Ctrl-C to exit" in text and "connection lost" in text
    waiting = frame_text([], 100, unicode=False, waiting_for="llama")
    assert "waiting for llama" in waiting


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_live_frame_fits_narrow_terminals(width: int) -> None:
    views = [job_view(tp("llama-7b-finetune", "a", status=training_status(50)))]
    lines = frame_text(views, width).splitlines()
    assert all(len(line) <= width for line in lines), lines
    row = next(line for line in lines if line.startswith("llama"))
    filled, cells = bar_cells(row)
    assert cells >= 10 and filled == round(cells / 2)
    assert "50/100" in row and "Training" in row  # never dropped
    header = lines[0].split()
    if width <= 80:
        assert "CHECKPOINT" not in header  # the first to go
    if width >= 120:
        assert "CHECKPOINT" in header and "checkpoint-50" in row


def test_hostile_names_in_the_table_are_cleaned() -> None:
    obj = tp("x", "ns", status=training_status(3, loss="\x1b[31m1.0", estimatedTimeRemaining="[b]"))
    out = status_table([job_view(obj)], NOW, all_namespaces=False)
    assert "\x1b" not in out and "?[31m1.0" in out and "[b]" in out


def test_errors_are_one_line_that_say_what_to_do() -> None:
    server = "https://127.0.0.1:6443"
    forbidden = api_error(
        403,
        json.dumps(
            {
                "kind": "Status",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
                "message": 'trainingprogresses.kubeckpt.io is forbidden: User "system:'
                'serviceaccount:t:viewer" cannot list resource "trainingprogresses" in API group '
                '"kubeckpt.io" in the namespace "t"',
            }
        ).encode(),
    )
    e = translate(forbidden, "list", "trainingprogresses.kubeckpt.io", "t", server)
    assert e.code == 1
    assert e.message.startswith(
        'forbidden: you cannot list trainingprogresses.kubeckpt.io in namespace "t" '
        '(User "system:serviceaccount:t:viewer")'
    )
    assert "ask an admin" in e.message
    down = translate(TransportError("GET /x: ClientConnectorError(...)"), "list", "r", None, server)
    assert down.message.startswith(f"cannot reach the API server at {server}")
    assert down.transient and not e.transient  # --watch retries only the former
    assert "in any namespace" in translate(forbidden, "watch", "r", None, server).message
    assert translate(api_error(404, b""), "get", "pods", "t", server).code == EXIT_NOT_FOUND
    assert (
        "kubectl apply -k config/default"
        in translate(ResourceNotFound("no API"), "get", "r", "t", server).message
    )
    for err in (forbidden, down):
        assert "\n" not in str(err)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["describe", "j", "-A"], "takes one job"),
        (["-A", "status", "j"], "needs one namespace"),
        (["status", "-w", "-o", "json"], "--watch"),
        (["checkpoints"], "the following arguments are required: job"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2(argv, fragment, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_options_before_and_after_the_command_and_no_kubeconfig(tmp_path: Path) -> None:
    env = {"KUBECONFIG": "", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    for argv in (["-n", "x", "status"], ["status", "-n", "x"], ["describe", "j"]):
        proc = run_cli(*argv, env=env)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("kubeckpt: no kubeconfig: set KUBECONFIG")
    bad = tmp_path / "config"
    bad.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    proc = run_cli("--kubeconfig", str(bad), "status", env=env)
    assert proc.returncode == 1 and proc.stderr.startswith(f"kubeckpt: cannot use kubeconfig {bad}")
    help_text = run_cli("--help").stdout
    assert "exit codes:" in help_text and "3    the job" in help_text


def test_checkpoint_listing_formatting_on_real_checkpoints(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "ckpt", "persistent")
    for step, extra in ((5, {"reason": "periodic"}), (10, {}), (20, {})):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * 3000)
        m = build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier="persistent", extra=extra
        )
        tier.commit(step, m)
    (tmp_path / "ckpt" / "checkpoint-30").mkdir()  # a save that never finished
    doc = json.loads(listing.render(listing.listing(tier.root, str(tmp_path / "no-local"))))
    status = training_status(20)
    status["checkpointing"]["latestCheckpoint"] = str(tmp_path / "ckpt" / "checkpoint-20")
    status["checkpointing"]["latestCheckpointReason"] = "jit"
    status["resumedFrom"] = str(tmp_path / "ckpt" / "checkpoint-5")
    ck.add_reasons(doc, tp("j", "ns", status=status))
    rows = ck.checkpoint_rows(doc)
    # The manifest's reason; for manifests without one, the status's for the latest checkpoint.
    assert [r[:5] for r in rows] == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["persistent", "checkpoint-20", "20", "complete", "jit"],
        ["persistent", "checkpoint-10", "10", "complete", "-"],
        ["persistent", "checkpoint-5", "5", "complete", "periodic,resumed-from"],
    ]
    assert rows[1][7:] == ["2.9 KiB", "1"]
    notes = ck.checkpoint_notes(doc)
    assert "checkpoint-30 (persistent): no manifest: the save did not finish" in notes
    assert any(n.startswith("local tier") and "does not exist" in n for n in notes)
    out = table(ck.CHECKPOINT_HEADERS, rows).splitlines()
    assert out[0].split() == [
        "TIER",
        "CHECKPOINT",
        "STEP",
        "STATE",
        "REASON",
        "SAVED",
        "AGE",
        "SIZE",
        "FILES",
    ]


def test_injected_settings_read_back_from_a_mutated_pod() -> None:
    pod = injected_pod("llama", "team-a")
    s = injected_settings(pod, "PyTorchJob")
    assert s["container"] == "pytorch" and s["injected"] is True
    assert s["status"]["policy"] == "team-default"
    assert s["env"]["CHECKPOINT_URI"] == "/mnt/kubeckpt/team-a/llama"
    assert s["env"]["CHECKPOINT_INTERVAL"] == "600"  # the pod's own annotation override
    assert s["env"]["KUBECKPT_NAMESPACE"] == "<field metadata.namespace>"
    assert s["annotations"] == {"kubeckpt.io/interval": "10m"}
    assert s["preStop"] and s["terminationGracePeriodSeconds"] >= 30
    assert "kubeckpt-run" in s["volumes"]
    assert ck.container_of(pod, "PyTorchJob") == "pytorch"
