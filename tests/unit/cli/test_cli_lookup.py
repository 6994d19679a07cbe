"""`kubeckpt status/describe/checkpoints JOB` find the job's TrainingProgress by spec.jobRef: a
PyTorchJob and a TrainJob may share a name (their TrainingProgress objects are `llama` and
`llama-trainjob`); without --kind that is a usage error that names the kinds."""

from __future__ import annotations

import pytest

from kubeckpt_cli.cluster import choose_progress
from kubeckpt_cli.errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError
from kubeckpt_cli.main import KINDS, main, parser
from kubeckpt_cli.view import job_view
from tests.support.cli_objects import tp, training_status


def named(name: str, job: str, kind: str, created: str = "2026-03-01T00:00:00Z") -> dict:
    obj = tp(job, "ns", kind=kind, status=training_status(10))
    obj["metadata"].update(name=name, creationTimestamp=created)
    return obj


PT = named("llama", "llama", "PyTorchJob")
TJ = named("llama-trainjob", "llama", "TrainJob")
OTHER = named("gpt", "gpt", "PyTorchJob")


def test_one_job_of_that_name_is_found_by_its_job_ref() -> None:
    assert choose_progress([OTHER, TJ], "llama", "ns") is TJ
    assert choose_progress([OTHER, PT], "llama", "ns", "PyTorchJob") is PT


def test_same_named_jobs_of_two_kinds_need_kind() -> None:
    with pytest.raises(CliError) as e:
        choose_progress([PT, TJ, OTHER], "llama", "ns")
    assert e.value.code == EXIT_USAGE
    assert e.value.message == (
        'several jobs are named "llama" in namespace "ns" (PyTorchJob, TrainJob): '
        "choose one with --kind"
    )
    assert choose_progress([PT, TJ], "llama", "ns", "TrainJob") is TJ
    assert choose_progress([PT, TJ], "llama", "ns", "PyTorchJob") is PT


def test_the_progress_objects_own_name_still_finds_it() -> None:
    """`kubectl get tp` shows `llama-trainjob`: that name works too."""
    assert choose_progress([PT, TJ], "llama-trainjob", "ns") is TJ
    with pytest.raises(CliError) as e:
        choose_progress([PT, TJ], "llama-trainjob", "ns", "PyTorchJob")
    assert e.value.code == EXIT_NOT_FOUND


def test_not_found_says_what_to_do() -> None:
    with pytest.raises(CliError) as e:
        choose_progress([PT], "nope", "ns")
    assert e.value.code == EXIT_NOT_FOUND
    assert e.value.message == (
        'no training job "nope" in namespace "ns" (no TrainingProgress of that name): check '
        "-n, or list the jobs with `kubeckpt status -A`"
    )
    with pytest.raises(CliError) as e:
        choose_progress([PT], "llama", "ns", "TrainJob")
    assert e.value.message.startswith('no TrainJob "llama" in namespace "ns"')


def test_a_predecessors_progress_gives_way_to_the_newest() -> None:
    old = named("llama", "llama", "PyTorchJob", "2026-01-01T00:00:00Z")
    new = named("llama-pytorchjob", "llama", "PyTorchJob", "2026-02-01T00:00:00Z")
    assert choose_progress([old, new], "llama", "ns") is new


def test_the_table_shows_the_jobs_name_and_kind() -> None:
    views = [job_view(PT), job_view(TJ)]
    assert [(v.name, v.kind) for v in views] == [("llama", "PyTorchJob"), ("llama", "TrainJob")]


def test_kind_is_an_option_of_every_command() -> None:
    assert KINDS == ("PyTorchJob", "TrainJob")
    for argv in (
        ["status", "llama", "--kind", "TrainJob"],
        ["--kind", "TrainJob", "describe", "llama"],
        ["checkpoints", "llama", "--kind", "PyTorchJob"],
        ["status", "--kind", "TrainJob"],
    ):
        args = parser().parse_args(argv)
        assert args.kind in KINDS, argv


def test_an_unknown_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["status", "llama", "--kind", "MPIJob"])
    assert e.value.code == 2
    assert "invalid choice: 'MPIJob'" in capsys.readouterr().err
