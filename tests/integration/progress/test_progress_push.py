"""The progress push endpoint on the real control plane: real projected-style tokens (TokenRequest
bound to the pod, our audience) checked by the API server's TokenReview, KWOK pods owned by a
PyTorchJob through the training-operator. Each refusal leaves the TrainingProgress as it was; an
unmodified transformers KubeflowCallback pushes; a pod that stops pushing is read by exec again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from progress_support import (
    eventually,
    get_json,
    get_tp,
    progress,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from localcluster.processes import free_port
from progress_controller.controller import ProgressController
from progress_controller.discovery import PYTORCHJOB
from progress_controller.push import MAX_BODY_BYTES, PushEndpoint, push_path, serve_push
from progress_controller.push_auth import PUSH_AUDIENCE, PushAuth
from reconciler.client import Client
from reconciler.pki import self_signed


def token(cluster: LocalCluster, ns: str, pod: dict, audience: str | None = PUSH_AUDIENCE) -> str:
    """A ServiceAccount token bound to `pod`, as the kubelet projects one."""
    md = pod["metadata"]
    args = ["create", "token", pod["spec"].get("serviceAccountName") or "default", "-n", ns]
    args += ["--bound-object-kind=Pod", f"--bound-object-name={md['name']}"]
    args += [f"--bound-object-uid={md['uid']}", "--duration=10m"]
    if audience:
        args.append(f"--audience={audience}")
    return cluster.kubectl(*args).stdout.strip()


def write_certs(certs: Path) -> None:
    cert, key = self_signed(["localhost"])
    certs.mkdir(exist_ok=True)
    (certs / "tls.crt").write_bytes(cert)
    (certs / "tls.key").write_bytes(key)


@contextlib.asynccontextmanager
async def push_server(ctrl: ProgressController, certs: Path) -> AsyncIterator[str]:
    write_certs(certs)
    port = free_port()
    endpoint = PushEndpoint(ctrl, PushAuth(ctrl.client))
    task = asyncio.create_task(serve_push(endpoint, "127.0.0.1", port, str(certs)))
    base = f"https://localhost:{port}"
    try:
        yield base
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def post(
    base: str, path: str, body: bytes, bearer: str | None, ca: Path
) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(ca))
    headers = {"Content-Type": "application/json"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    for _ in range(50):  # the server may still be starting
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(base + path, data=body, headers=headers, ssl=ctx) as r,
            ):
                text = await r.text()
                try:
                    return r.status, json.loads(text)
                except ValueError:
                    return r.status, {}
        except aiohttp.ClientConnectorError:
            await asyncio.sleep(0.2)
        except aiohttp.ClientError:
            if len(body) <= MAX_BODY_BYTES:
                raise
            # The server answered 413 and closed the connection before the upload ended: the
            # client may see the reset before the answer.
            return 413, {}
    raise AssertionError("the push endpoint never answered")


async def status(client: Client, ns: str, name: str) -> dict[str, Any]:
    tp = await get_tp(client, ns, name)
    return (tp or {}).get("status") or {}


async def test_push_is_bound_to_its_pod_and_refusals_change_nothing(
    kwok: LocalCluster, client: Client, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    path = start_job(kwok, ns, "train", progress(1))
    start_job(kwok, ns, "other", progress(7))
    ca = tmp_path / "certs" / "tls.crt"
    async with running_controller(client) as ctrl:
        reads: list[str] = []
        read = ctrl._read

        async def counting(pod: dict, container: dict, kind: Any) -> Any:
            reads.append(pod["metadata"]["name"])
            return await read(pod, container, kind)

        ctrl._read = counting  # type: ignore[method-assign]

        async def step_of(name: str, step: int, source: str) -> bool:
            st = await status(client, ns, name)
            return st.get("step") == step and st.get("source") == source

        await eventually(lambda: step_of("train", 1, "exec"), "first exec read", 90)
        await eventually(lambda: step_of("other", 7, "exec"), "other's exec read", 30)
        pod = get_json(kwok, "pod", "train-master-0", ns)
        other_pod = get_json(kwok, "pod", "other-master-0", ns)
        mine, theirs = token(kwok, ns, pod), token(kwok, ns, other_pod)
        url = push_path(PYTORCHJOB, ns, "train")
        other_url = push_path(PYTORCHJOB, ns, "other")
        async with push_server(ctrl, tmp_path / "certs") as base:
            # Accepted: the job's own pod, our audience. The file says the same, as the runtime
            # writes both: an exec read between pushes finds what was pushed.
            write_atomic(path, progress(50))
            code, echo = await post(base, url, progress(50), mine, ca)
            assert code == 200, echo
            assert echo["step"] == 50
            await eventually(lambda: step_of("train", 50, "push"), "the push recorded", 30)

            before = {n: await status(client, ns, n) for n in ("train", "other")}
            refused = [
                # Another pod's token: a pod updates only its own job.
                (other_url, progress(99), mine, 403),
                (url, progress(99), theirs, 403),
                # No token, a token of the API server's audience, a forged one.
                (url, progress(99), None, 401),
                (url, progress(99), token(kwok, ns, pod, audience=None), 401),
                (url, progress(99), mine[:-4] + "AAAA", 401),
                # Too large: refused before it is read.
                (url, b"x" * (10 * 1024 * 1024), mine, 413),
                (url, b"x" * (MAX_BODY_BYTES + 1), mine, 413),
                # Hostile bodies.
                (url, b'{"step": "99"}', mine, 400),
                (url, b"[" * 200 + b"]" * 200, mine, 400),
                (url, b'{"step": NaN}', mine, 400),
                (url, b'{"step": 1' + b"0" * 30 + b"}", mine, 400),
                (url, json.dumps({"step": 99, "resumedFrom": "\x1b[2J"}).encode(), mine, 400),
                (url, b'{"trainerStatus": {"progressPercentage": 1e308}}', mine, 400),
                # No such job kind.
                (url.replace("pytorchjobs", "tfjobs"), progress(99), mine, 404),
            ]
            for path_, body, bearer, want in refused:
                code, answer = await post(base, path_, body, bearer, ca)
                assert code == want, (path_, body[:60], answer)
                if answer:
                    assert answer["kind"] == "Status" and answer["message"], answer
            await asyncio.sleep(2.5)  # a wrongly accepted push would have been written by now
            for n, st in before.items():
                # The source may turn to exec (pushes stopped: polled again), the step not.
                assert (await status(client, ns, n)).get("step") == st.get("step"), n

            # While pushes arrive, the pod is not read by exec.
            write_atomic(path, progress(51))
            assert (await post(base, url, progress(51), mine, ca))[0] == 200
            await eventually(lambda: step_of("train", 51, "push"), "push 51", 30)
            reads.clear()  # from here on pushes arrive every 0.5 s
            for step in range(52, 57):
                write_atomic(path, progress(step))
                assert (await post(base, url, progress(step), mine, ca))[0] == 200
                await asyncio.sleep(0.5)
            await eventually(lambda: step_of("train", 56, "push"), "the last push", 30)
            assert "train-master-0" not in reads, reads
            # Pushes stop: within twice their interval (plus the poll) it is read again.
            write_atomic(path, progress(77))
            await eventually(lambda: step_of("train", 77, "exec"), "polled again", 30)

            # The pod replaced (a new UID): its predecessor's token is a replay and is refused.
            await asyncio.to_thread(
                kwok.kubectl, "delete", "pod", "train-master-0", "-n", ns, "--wait=false"
            )

            async def replaced() -> bool:
                p = await asyncio.to_thread(kwok.kubectl, "get", "pod", "-n", ns, "-o", "json")
                pods = json.loads(p.stdout)["items"]
                return any(
                    q["metadata"]["name"] == "train-master-0"
                    and q["metadata"]["uid"] != pod["metadata"]["uid"]
                    for q in pods
                )

            await eventually(replaced, "the master pod recreated", 60)
            before_replay = await status(client, ns, "train")
            code, answer = await post(base, url, progress(98), mine, ca)
            # 401 when the API server sees the bound pod gone, 403 when our cache still holds
            # the token's review and the pod's UID differs: refused either way.
            assert code in (401, 403), answer
            await asyncio.sleep(2.0)
            assert (await status(client, ns, "train")).get("step") != 98
            assert (await status(client, ns, "train")).get("step") == before_replay.get("step")


async def test_unmodified_kubeflow_callback_pushes(
    kwok: LocalCluster,
    client: Client,
    namespace: str,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations.integration_utils import KubeflowCallback

    ns = namespace
    start_job(kwok, ns, "hf", progress(1))
    ca = tmp_path / "certs" / "tls.crt"
    async with running_controller(client) as ctrl:
        await eventually(lambda: _step(client, ns, "hf", 1), "first exec read", 90)
        pod = get_json(kwok, "pod", "hf-master-0", ns)
        tok = tmp_path / "token"
        tok.write_text(token(kwok, ns, pod))
        async with push_server(ctrl, tmp_path / "certs") as base:
            monkeypatch.setenv(
                "KUBEFLOW_TRAINER_SERVER_URL", base + push_path(PYTORCHJOB, ns, "hf")
            )
            monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(tok))
            monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(ca))
            await post(base, "/", b"{}", None, ca)  # wait for the server
            cb = KubeflowCallback()
            args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True)
            state, control = TrainerState(max_steps=100, global_step=0), TrainerControl()
            await asyncio.to_thread(cb.on_train_begin, args, state, control)
            cb.on_log(args, state, control, logs={"loss": 0.25, "learning_rate": 1e-4})
            await asyncio.sleep(5.1)  # the callback sends at most one update per 5 s
            state.global_step = 40
            await asyncio.to_thread(cb.on_step_end, args, state, control)
            pushed = lambda: _step(client, ns, "hf", 40, "push")  # noqa: E731
            await eventually(pushed, "the callback's push", 30)
            st = await status(client, ns, "hf")
            assert st["loss"] == "0.25" and st["totalSteps"] == 100
            assert ctrl.pushes == 1  # the train-begin push has no step: nothing recorded


async def _step(client: Client, ns: str, name: str, step: int, source: str = "exec") -> bool:
    st = await status(client, ns, name)
    return st.get("step") == step and st.get("source") == source
