"""The JAX state's snapshot for a save: host memory only, never a second copy on the device.

A save must write the state of its step even though the next training step may donate the
state's buffers (`donate_argnums`) and XLA may then overwrite them in place. How:

- CPU, "view" (the default where it is safe): `np.asarray` of a CPU array is a view of its buffer,
  no copy at all. XLA does not donate a buffer that has an external reference (a numpy view): the
  step allocates a new output instead and the view keeps the old bytes. `views_are_safe()` checks
  exactly that on this jax/jaxlib once per process, so a jaxlib that donated anyway would make
  this module copy instead of writing a changed buffer.
- CPU, "copy": `np.copyto` into host buffers kept from one save to the next (no allocation, no
  page faults after the first save); a snapshot's buffers go back to the pool when its save is
  done with them (the staged save is released).
- GPU/TPU: every shard's transfer to host is started before any is waited for (one batched
  device-to-host copy): into pinned host memory (`memory_kind="pinned_host"`) where the device
  has it, an ordinary jax op ordered before any later step that donates, and gathered into numpy
  on the writer thread; elsewhere `copy_to_host_async` on each shard, gathered before the save
  call returns (a donated array can no longer be read). No device memory is allocated.

numpy leaves are copied (the caller may change them in place); Python scalars are kept.
"""

from __future__ import annotations

import functools
import json
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .shards import shard_index

MODES = ("auto", "view", "copy")


@dataclass
class HostLeaf:
    """One leaf as the local format writes it: its description and this process's parts."""

    desc: dict[str, Any]
    parts: list[Any]  # numpy arrays, or pinned-host jax.Arrays until `gather()`
    pooled: list[np.ndarray] = field(default_factory=list)

    def gather(self) -> None:
        self.parts = [p if isinstance(p, np.ndarray) else np.asarray(p) for p in self.parts]


@functools.cache
def views_are_safe() -> bool:
    """True when a numpy view of a CPU jax.Array keeps its bytes through a donating step."""
    import jax

    cpu = jax.local_devices(backend="cpu")[0]  # this process's: jax.devices() is global
    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    x = jax.device_put(np.zeros(4096, np.float32), cpu)
    view = np.asarray(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Some donated buffers were not usable"
        step(x).block_until_ready()
    return not x.is_deleted() and not view.any()


def _in_host_memory(device: Any) -> bool:
    """A CPU device: its arrays are host memory already (numpy can view them)."""
    return device.platform == "cpu"


def _pinned(device: Any) -> Any:
    """The device's pinned host memory kind's sharding, or None."""
    import jax

    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except Exception:  # a backend without memories
        return None
    if "pinned_host" not in kinds:
        return None
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")


class HostBufferPool:
    """Host buffers by (shape, dtype), reused across saves; thread-safe (released on the writer)."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        key = (tuple(shape), str(np.dtype(dtype)))
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return np.empty(shape, dtype)

    def release(self, buffers: list[np.ndarray]) -> None:
        with self._lock:
            for buf in buffers:
                self._free.setdefault((buf.shape, str(buf.dtype)), []).append(buf)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for bufs in self._free.values() for b in bufs)


class Snapshotter:
    """Takes host snapshots of a list of leaves; one per manager (it owns the buffer pool)."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"snapshot mode {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self.pool = HostBufferPool()

    def cpu_mode(self) -> str:
        if self.mode == "auto":
            return "view" if views_are_safe() else "copy"
        return self.mode

    def take(self, leaves: list[Any]) -> list[HostLeaf]:
        """On the training thread: every leaf's host parts, safe from any later step."""
        import jax

        out: list[HostLeaf] = []
        waiting: list[tuple[HostLeaf, int, Any]] = []  # device shards being copied to host
        for leaf in leaves:
            if not isinstance(leaf, jax.Array):
                value = np.array(leaf)  # a copy: numpy leaves can change in place
                kind = (
                    "scalar" if np.ndim(leaf) == 0 and not isinstance(leaf, np.ndarray) else "numpy"
                )
                desc = {"kind": kind, "shape": list(value.shape), "dtype": str(value.dtype)}
                desc["shards"] = [[[0, n] for n in value.shape]]
                out.append(HostLeaf(desc, [value]))
                continue
            host = HostLeaf(
                {
                    "kind": "array",
                    "shape": list(leaf.shape),
                    "dtype": str(leaf.dtype),
                    "shards": [],
                },
                [],
            )
            seen = set()
            for shard in leaf.addressable_shards:
                idx = shard_index(shard.index, leaf.shape)
                key = json.dumps(idx)
                if key in seen:
                    continue
                seen.add(key)
                host.desc["shards"].append(idx)
                host.parts.append(self._start(host, shard.data, waiting))
            out.append(host)
        for host, i, data in waiting:  # copy_to_host_async: all started, now gathered
            host.parts[i] = np.asarray(data)
        return out

    def _start(self, host: HostLeaf, data: Any, waiting: list[tuple[HostLeaf, int, Any]]) -> Any:
        import jax

        device = next(iter(data.devices()))
        if _in_host_memory(device):
            view = np.asarray(data)
            if self.cpu_mode() == "view":
                return view
            buf = self.pool.take(view.shape, view.dtype)
            np.copyto(buf, view)
            host.pooled.append(buf)
            return buf
        pinned = _pinned(device)
        if pinned is not None:
            return jax.device_put(data, pinned)  # asynchronous; gathered by `HostLeaf.gather`
        data.copy_to_host_async()
        waiting.append((host, len(host.parts), data))
        return None

    def hold(self, owner: object, leaves: list[HostLeaf]) -> None:
        """Give `leaves`' pooled buffers back when `owner` (the staged save) is released."""
        buffers = [b for leaf in leaves for b in leaf.pooled]
        if buffers:
            weakref.finalize(owner, self.pool.release, buffers)
