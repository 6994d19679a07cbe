"""trainer_runtime.jax.agreement over a real coordination service (two `jax.distributed`
processes on localhost): the answers, the pipelined round, and a process that stops answering."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from harness import process_env

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import jax
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank)
    from trainer_runtime.jax.agreement import groups
    from trainer_runtime.protocol import AgreementError
    step, io, ctl = groups(True)
    got = {"gather": io.all_gather({"rank": rank}), "max": io.all_max([rank, 5 - rank])}
    got["broadcast"] = io.broadcast(f"from {rank}", src=1)
    pending = step.start_max([rank * 10])  # pipelined: answered later,
    got["ctl"] = ctl.all_max([7])          # while another namespace's round goes on
    got["pipelined"] = pending.wait()
    for _ in range(5):                     # keys of old rounds are deleted as rounds go on
        io.all_max([0])
    ctl.all_max([0])                       # both are past their last io round
    got["io_keys"] = sorted(k for k, _ in io.client.key_value_dir_get("kubeckpt/io/"))
    if rank == 1:
        time.sleep(8)                      # stops answering; stays alive
    else:
        t0 = time.monotonic()
        try:
            io.all_max([1])
            got["silent"] = "answered"
        except AgreementError as e:
            got["silent"] = str(e)
        got["waited"] = time.monotonic() - t0
    with open(out, "w") as f:
        json.dump(got, f)
    """
)


def test_answers_and_a_silent_process(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = process_env({"KUBECKPT_AGREEMENT_TIMEOUT": "2", "JAX_PLATFORMS": "cpu"})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(r), str(port), str(tmp_path / f"out-{r}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    outs = []
    for r in range(2):
        assert (tmp_path / f"out-{r}.json").exists(), logs[r][-3000:]
        outs.append(json.loads((tmp_path / f"out-{r}.json").read_text()))
    for got in outs:
        assert got["gather"] == [{"rank": 0}, {"rank": 1}]
        assert got["max"] == [1, 5]
        assert got["broadcast"] == "from 1"
        assert got["ctl"] == [7]
        assert got["pipelined"] == [10]
    # 8 io rounds, then a ctl round both passed: only the last two io rounds' keys are left, one
    # per process (read by process 0, which starts no io round before; process 1 never does).
    assert outs[0]["io_keys"] == [f"kubeckpt/io/{n}/{r}" for n in (7, 8) for r in (0, 1)]
    assert "process 1 did not answer" in outs[0]["silent"], outs[0]
    assert 1.5 < outs[0]["waited"] < 10, outs[0]  # KUBECKPT_AGREEMENT_TIMEOUT, not forever
