"""kubeckpt's callback beside transformers' KubeflowCallback (Kubeflow Trainer's TrainJobStatus
gate): both run; after a just-in-time stop KubeflowCallback does not report the job finished; the
resumed run reports completion as usual. The status server is a local HTTP server that records
what KubeflowCallback posts, as Trainer's would receive it."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubeckpt_env import kubeckpt_env
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback, TrainingArguments

from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.hf import kubeckpt_trainer

STEPS = 10


@pytest.fixture(autouse=True)
def sigterm_handler_restored() -> Iterator[None]:
    """A JIT stop leaves kubeckpt's logging SIGTERM handler installed (by design, for the
    kubelet's later SIGTERM): the next test gets the process's own back."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Posts:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.auth: list[str] = []


@pytest.fixture
def status_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Posts]:
    posts = Posts()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posts.bodies.append(json.loads(body))
            posts.auth.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("a-projected-token")
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"
    # What Trainer injects into the `node` container with the gate on.
    monkeypatch.setenv(
        "KUBEFLOW_TRAINER_SERVER_URL", f"http://127.0.0.1:{server.server_port}{path}"
    )
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", raising=False)
    try:
        yield posts
    finally:
        server.shutdown()


class _RequestAt(TrainerCallback):
    """The preStop hook's request file, as a preemption writes it."""

    def __init__(self, run: Path, step: int) -> None:
        self.run, self.step = run, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.run.mkdir(exist_ok=True)
            (self.run / "checkpoint-request").write_text("")


def _trainer(tmp: Path, report_to: str | list[str]) -> Trainer:
    config = Config.from_env(kubeckpt_env(tmp, CHECKPOINT_SAVE_STEPS="100"))
    args = TrainingArguments(
        output_dir=str(tmp / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenDataset())
    return kubeckpt_trainer(trainer, config)


def _kubeflow(trainer: Trainer) -> list:
    return [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "KubeflowCallback"]


def test_both_report_and_a_preempted_run_is_not_reported_finished(
    tmp_path: Path, status_server: Posts
) -> None:
    first = _trainer(tmp_path, "all")
    assert len(_kubeflow(first)) == 1, "report_to=all with the server URL set adds it"
    first.callback_handler.callbacks.insert(0, _RequestAt(tmp_path / "run", 4))
    first.train()
    assert first.kubeckpt.stopped and first.state.global_step == 4
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(4, True)]
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 4 and progress["checkpointing"]["latestCheckpointReason"] == "jit"
    reported = [b["trainerStatus"].get("progressPercentage") for b in status_server.bodies]
    assert reported and reported[0] == 0  # on_train_begin
    assert 100 not in reported, reported
    assert set(status_server.auth) == {"Bearer a-projected-token"}

    before = len(status_server.bodies)
    second = _trainer(tmp_path, ["kubeflow"])
    second.train()
    assert second.kubeckpt.resumed_from == str(tmp_path / "ckpt" / "checkpoint-4")
    assert not second.kubeckpt.stopped and second.state.global_step == STEPS
    last = status_server.bodies[-1]["trainerStatus"]
    assert len(status_server.bodies) > before
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0


def test_without_the_gate_there_is_no_kubeflow_callback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    trainer = _trainer(tmp_path, "all")
    assert not _kubeflow(trainer)
    trainer.train()
    assert trainer.state.global_step == STEPS
