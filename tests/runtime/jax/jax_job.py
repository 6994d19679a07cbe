"""A small JAX training job for the JAX runtime tests: an MLP with optax Adam, data-parallel over
every process (one CPU device each, gloo collectives), the batch of step s drawn from a key folded
with s, so a resumed run sees exactly the data an uninterrupted one does.

    python jax_job.py --status-dir D --steps N [--sleep S] [--process-id K --num-processes P
                      --coordinator HOST:PORT]

Writes D/final-<k>.npz (every leaf of the final state, in tree order) and D/exit-<k>.json."""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_platforms", "cpu")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--status-dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--coordinator", default="")
    ap.add_argument(
        "--orbax-fails-at", type=int, default=0, help="this process's N-th orbax save raises"
    )
    ap.add_argument(
        "--killed-in-save",
        type=int,
        default=0,
        help="SIGKILL this process as its N-th orbax save starts (before orbax's first barrier)",
    )
    ap.add_argument("--heartbeat-timeout", type=int, default=100, help="jax.distributed's")
    args = ap.parse_args()
    if args.num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            heartbeat_timeout_seconds=args.heartbeat_timeout,
        )

    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from trainer_runtime.jax import CheckpointManager

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    per_process = NamedSharding(mesh, P("data"))
    sizes = [8, 32, 32, 1]

    def init_params(key):
        params = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            k = jax.random.fold_in(key, i)
            params.append({"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)})
        return params

    optimizer = optax.adam(1e-2)
    params = jax.jit(init_params, out_shardings=replicated)(jax.random.key(0))
    state = {
        "params": params,
        "opt": jax.jit(optimizer.init, out_shardings=replicated)(params),
        "seen": np.zeros((), np.int64),  # a host-side counter, restored too
    }

    def loss_fn(params, x, y):
        h = x
        for layer in params[:-1]:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        out = h @ params[-1]["w"] + params[-1]["b"]
        return jnp.mean((out - y) ** 2)

    # Donates the state's buffers as real loops do: a save of step s must still write step s.
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt = optimizer.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    def batch(step):
        # This process's rows of the global batch of `step`: the same data whatever the restarts.
        key = jax.random.fold_in(jax.random.key(1), step)
        x = np.asarray(jax.random.normal(key, (4 * args.num_processes, sizes[0])))
        y = np.sin(x.sum(axis=1, keepdims=True))
        rows = slice(4 * args.process_id, 4 * (args.process_id + 1))
        return (
            jax.make_array_from_process_local_data(per_process, x[rows]),
            jax.make_array_from_process_local_data(per_process, y[rows]),
        )

    if args.orbax_fails_at:
        _fail_orbax_save(args.orbax_fails_at)
    if args.killed_in_save:
        _killed_in_orbax_save(args.killed_in_save)
    mgr = CheckpointManager.from_env(total_steps=args.steps)
    state, step = mgr.restore(state)
    resumed = (mgr.resumed_from, mgr.resumed_tier)
    while step < args.steps:
        x, y = batch(step)
        params, opt, loss = train_step(state["params"], state["opt"], x, y)
        state = {"params": params, "opt": opt, "seen": state["seen"] + 1}
        step += 1
        if args.sleep:
            time.sleep(args.sleep)
        if mgr.step_end(step, state, loss=loss):
            break
    mgr.close()
    args.status_dir.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree_util.tree_leaves(state)
    np.savez(
        args.status_dir / f"final-{args.process_id}.npz",
        *[np.asarray(x.addressable_data(0) if isinstance(x, jax.Array) else x) for x in leaves],
    )
    info = {
        "step": step,
        "stopped": mgr.stopped,
        "resumed_from": resumed[0],
        "resumed_tier": resumed[1],
        "failed_saves": mgr.failed_saves,
        "last_error": mgr.last_error,
        "exit_code": mgr.exit_code,
    }
    (args.status_dir / f"exit-{args.process_id}.json").write_text(json.dumps(info))
    if args.num_processes > 1:
        jax.distributed.shutdown()
    return mgr.exit_code


def _at_nth_call(owner: Any, name: str, n: int, act: Callable[[], None]) -> None:
    """`owner.name` runs `act` before its n-th call in this process (a fault injected there)."""
    original = getattr(owner, name)
    calls = itertools.count(1)

    def wrapped(*a, **kw):
        if next(calls) == n:
            act()
        return original(*a, **kw)

    setattr(owner, name, wrapped)


def _fail_orbax_save(n: int) -> None:
    """The n-th orbax save of this process fails in its blocking part, after orbax's start
    barrier (as a host transfer failing on one process would): the others are then in orbax's
    own barriers, waiting for this one."""
    from orbax.checkpoint import StandardCheckpointHandler

    def fail() -> None:
        raise OSError("injected: this process's orbax save failed")

    _at_nth_call(StandardCheckpointHandler, "async_save", n, fail)


def _killed_in_orbax_save(n: int) -> None:
    """The n-th orbax save of this process kills it as it starts, after kubeckpt's agreement on
    the step and before orbax's barrier at the start of its save: the others then wait there."""
    from trainer_runtime.jax import orbax_format

    _at_nth_call(orbax_format, "start", n, lambda: os.kill(os.getpid(), signal.SIGKILL))


if __name__ == "__main__":
    sys.exit(main())
