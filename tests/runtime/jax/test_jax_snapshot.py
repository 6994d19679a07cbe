"""trainer_runtime.jax.snapshot: what a save writes is the state of its step, bitwise, even when
the next steps donate the state's buffers, and no snapshot mode copies on the device."""

from __future__ import annotations

import functools
import gc
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer_runtime.jax import local_format, snapshot
from trainer_runtime.jax.snapshot import Snapshotter, views_are_safe


@functools.partial(jax.jit, donate_argnums=0)
def _step(state: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {k: v * 3 + 1 for k, v in state.items()}


def _state() -> dict[str, jax.Array]:
    return {
        "w": jnp.arange(1 << 16, dtype=jnp.float32).reshape(256, 256),
        "b": jnp.ones(256, dtype=jnp.bfloat16),
    }


def _steps(state: dict[str, jax.Array], n: int) -> dict[str, jax.Array]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # donation skipped while a view holds the buffer
        for _ in range(n):
            state = _step(state)
    return jax.block_until_ready(state)


def test_this_jaxlib_keeps_a_viewed_buffer_from_donation() -> None:
    # The "auto" mode's premise, checked on the installed jaxlib (it is cached per process).
    assert views_are_safe()
    assert Snapshotter().cpu_mode() == "view"


@pytest.mark.parametrize("mode", ["view", "copy"])
def test_a_snapshot_is_the_state_of_its_step_after_donating_steps(
    tmp_path: Path, mode: str
) -> None:
    snap = Snapshotter(mode)
    state = _steps(_state(), 1)
    expected = {k: np.array(v) for k, v in state.items()}  # an independent copy
    paths, leaves = ["w", "b", "n"], [state["w"], state["b"], 7]
    taken = snap.take(leaves)
    state = _steps(state, 3)  # donates; must not change what was taken
    assert not np.array_equal(np.asarray(state["w"]), expected["w"])
    files = local_format.write_process(tmp_path, 0, paths, taken)
    assert [f.path for f in files] == [local_format.data_file(0), local_format.index_file(0)]
    index = local_format.read_index(tmp_path, 0)
    got = local_format.read_process(tmp_path, 0, index, [state["w"], state["b"], 0])
    assert np.asarray(got[0]).tobytes() == expected["w"].tobytes()
    assert np.asarray(got[1]).tobytes() == expected["b"].tobytes()
    assert got[1].dtype == jnp.bfloat16 and got[2] == 7


def test_copy_mode_reuses_its_host_buffers_once_a_save_is_released() -> None:
    snap = Snapshotter("copy")
    state = _state()

    class Save:  # stands for the staged save that owns the buffers
        pass

    first = Save()
    taken = snap.take([state["w"]])
    buffer = taken[0].parts[0]
    snap.hold(first, taken)
    second = snap.take([state["w"]])  # the first save still holds its buffers: a new one
    assert second[0].parts[0] is not buffer
    del first, taken
    gc.collect()
    assert snap.pool.nbytes == buffer.nbytes
    third = snap.take([state["w"]])
    assert third[0].parts[0] is buffer  # reused, and refilled
    assert np.array_equal(buffer, np.asarray(state["w"]))


def test_a_numpy_leaf_is_copied_and_a_bad_mode_refused() -> None:
    value = np.zeros(4)
    taken = Snapshotter().take([value])
    value[:] = 1
    assert not taken[0].parts[0].any()
    with pytest.raises(ValueError, match="snapshot mode"):
        Snapshotter("fast")


@pytest.mark.parametrize("pinned", [True, False])
def test_the_device_path_is_ordered_before_a_donating_step(
    monkeypatch: pytest.MonkeyPatch, pinned: bool
) -> None:
    # The GPU/TPU path, run on CPU devices (they have a pinned_host memory kind too): the
    # transfer to pinned host memory (gathered later, on the writer thread), or
    # copy_to_host_async gathered before `take` returns.
    monkeypatch.setattr(snapshot, "_in_host_memory", lambda device: False)
    if not pinned:
        monkeypatch.setattr(snapshot, "_pinned", lambda device: None)
    state = _steps(_state(), 1)
    expected = {k: np.array(v) for k, v in state.items()}
    taken = Snapshotter().take([state["w"], state["b"]])
    kinds = {type(p).__name__ for leaf in taken for p in leaf.parts}
    assert kinds == ({"ArrayImpl"} if pinned else {"ndarray"}), kinds
    state = _steps(state, 3)  # donates the buffers the transfers read
    for leaf in taken:
        leaf.gather()
    assert taken[0].parts[0].tobytes() == expected["w"].tobytes()
    assert taken[1].parts[0].tobytes() == expected["b"].tobytes()
