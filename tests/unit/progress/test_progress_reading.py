"""Reading the progress file through a fake exec: argv only, the python3 fallback, the cap, and
every failure as a condition reason; rank-0 discovery."""

from __future__ import annotations

import pytest

from progress_controller import discovery as d
from progress_controller.reading import READ_CAP, ReadError, parse, read_file
from reconciler.exec import ExecError, ExecResult, ExecTimeout

GOOD = b'{"step": 3}'


class FakeExec:
    def __init__(self, *results: object) -> None:
        self.results = list(results)
        self.calls: list[list[str]] = []

    async def __call__(self, client, ns, pod, argv, *, container, max_bytes, stop_at_cap, timeout):  # noqa: ASYNC109
        assert isinstance(argv, list) and max_bytes == READ_CAP
        assert stop_at_cap is True  # an endless file costs the cap, not the timeout
        self.calls.append(argv)
        r = self.results.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r


async def test_cat_with_the_path_as_one_argument() -> None:
    fx = FakeExec(ExecResult(stdout=GOOD, exit_code=0))
    data, fallback = await read_file(fx, None, "ns", "p", "pytorch", "/a b/$(x);y")
    assert data == GOOD and not fallback
    assert fx.calls == [["cat", "/a b/$(x);y"]]


@pytest.mark.parametrize(
    "first",
    [
        ExecResult(exit_code=127, stderr=b"sh: cat: not found"),
        ExecError('exec: "cat": executable file not found in $PATH'),
    ],
)
async def test_python_fallback_when_cat_is_missing(first: object) -> None:
    fx = FakeExec(first, ExecResult(stdout=GOOD, exit_code=0))
    data, fallback = await read_file(fx, None, "ns", "p", None, "/f.json")
    assert data == GOOD and fallback
    argv = fx.calls[1]
    assert argv[:2] == ["python3", "-c"] and argv[3:] == ["/f.json", str(READ_CAP)]


async def test_no_reader_at_all() -> None:
    fx = FakeExec(ExecResult(exit_code=127), ExecResult(exit_code=127))
    with pytest.raises(ReadError) as e:
        await read_file(fx, None, "ns", "p", None, "/f")
    assert e.value.reason == "NoReader"


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (
            ExecResult(exit_code=1, stderr=b"cat: /f: No such file or directory"),
            "ProgressFileMissing",
        ),
        (ExecResult(exit_code=1, stderr=b"cat: /f: Permission denied"), "ProgressFileUnreadable"),
        (
            ExecResult(stdout=b"x" * READ_CAP, exit_code=0, stdout_truncated=True),
            "ProgressFileTooLarge",
        ),
        # Stopped at the cap (exec_command's stop_at_cap): no exit status, stdout truncated.
        (
            ExecResult(stdout=b"\0" * READ_CAP, exit_code=None, stdout_truncated=True),
            "ProgressFileTooLarge",
        ),
        # Stopped because stderr passed the cap: unreadable, not "missing" or "too large".
        (
            ExecResult(stdout=GOOD, stderr=b"e" * READ_CAP, stderr_truncated=True),
            "ProgressFileUnreadable",
        ),
        (ExecTimeout("slow", ExecResult()), "ExecTimeout"),
        (ExecError("container not running"), "ExecFailed"),
    ],
)
async def test_failures_become_reasons(result: object, reason: str) -> None:
    with pytest.raises(ReadError) as e:
        await read_file(FakeExec(result), None, "ns", "p", None, "/f")
    assert e.value.reason == reason and e.value.message


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "ProgressFileEmpty"),
        (b'{"step": 3, "loss": "0.', "ProgressFileInvalid"),
        (b'{"step": "three"}', "ProgressFileInvalid"),
        (b"[1]", "ProgressFileInvalid"),
        (b'{"step": 1, "loss": "' + b"9" * 2000 + b'"}', "ProgressFileInvalid"),
    ],
)
def test_parse_rejects_bad_files(data: bytes, reason: str) -> None:
    with pytest.raises(ReadError) as e:
        parse(data)
    assert e.value.reason == reason


def pod(name: str, labels: dict, created: str = "2026-01-01T00:00:00Z", **md: object) -> dict:
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": created, **md},
        "spec": {
            "containers": [
                {"name": "sidecar"},
                {
                    "name": "pytorch",
                    "env": [
                        {"name": "TRAINING_PROGRESS_FILE", "value": "/x/p.json"},
                        {"name": "PROGRESS_UPDATE_FREQUENCY", "value": "10"},
                    ],
                },
            ]
        },
    }


def test_rank0_discovery() -> None:
    master = {"training.kubeflow.org/job-role": "master"}
    worker = {
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
    }
    old = pod("j-master-0", master, "2026-01-01T00:00:00Z", deletionTimestamp="x")
    new = pod("j-master-0b", master, "2026-01-01T00:00:01Z")
    assert d.rank0_pod([pod("w", worker), old, new]) is new
    assert d.rank0_pod([pod("w", worker)]) is None
    by_type = {
        "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0",
    }
    assert d.is_rank0(pod("m", by_type))
    c = d.target_container(new)
    assert c is not None and c["name"] == "pytorch"
    assert d.progress_path(c) == "/x/p.json" and d.update_frequency(c) == 10
    assert d.progress_path({"name": "x"}) == d.DEFAULT_PROGRESS_PATH
    ts = {"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0"}
    assert d.is_rank0(pod("t", ts), d.TRAINJOB)
