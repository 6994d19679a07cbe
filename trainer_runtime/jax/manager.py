"""CheckpointManager: the one object a JAX training loop adopts.

    jax.distributed.initialize()              # when there are several processes
    mgr = CheckpointManager.from_env(total_steps=total)
    state, step = mgr.restore(state)          # the given state, or the newest checkpoint's
    while step < total:
        state, loss = train_step(state, batch)
        step += 1
        if mgr.step_end(step, state, loss=loss):
            break                             # a just-in-time checkpoint was saved
    mgr.close()
    sys.exit(mgr.exit_code)

The state is any pytree of jax.Arrays (global or process-local), numpy arrays and Python scalars:
a flax TrainState, an optax state, the data position and the PRNG key together. This is the JAX
adapter of the save protocol (trainer_runtime.protocol), beside the torch and HF ones: it supplies
the agreement (the coordination service's key-value store, agreement.py), staging (a host snapshot,
snapshot.py: a step that donates its input buffers cannot change what is being written, and no
second copy is made on the device), the writers (kubeckpt's per-process raw format, written in one
pass; orbax where every process writes one shared checkpoint or `persistent_format="orbax"`) and
the loader.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from ..adapter import AdapterBase
from ..config import Config
from ..contract import Manifest
from ..protocol import Report, SaveResult
from ..storage import LocalTier, Tier
from . import local_format, orbax_format
from .agreement import groups, member
from .snapshot import Snapshotter

log = logging.getLogger("trainer_runtime.jax")

FRAMEWORK = "jax"

__all__ = ["CheckpointManager"]


def _paths(tree: Any) -> tuple[list[str], list[Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(p) for p, _ in flat], [leaf for _, leaf in flat]


class _JaxSave:
    """One staged save: the protocol's `Staged` for JAX. `leaves`: the host snapshot, for the
    tiers in kubeckpt's format; `orbax`: orbax's save in flight, for a tier in orbax's."""

    def __init__(
        self,
        mgr: CheckpointManager,
        paths: list[str],
        leaves: list[Any],
        orbax: orbax_format.Pending | None = None,
    ) -> None:
        self.mgr = mgr
        self.paths = paths
        self.leaves = leaves
        self.orbax = orbax

    def prepare(self) -> None:
        jax.block_until_ready([x for x in self.leaves if isinstance(x, jax.Array)])

    def write(self, tier: Tier, directory: Path) -> list[local_format.WrittenFile]:
        if self.mgr._format(tier) == "orbax":
            if self.orbax is None:
                raise RuntimeError("orbax's save was not started for this tier")
            return orbax_format.finish(
                self.orbax, directory, self.mgr.rank, self.paths, self.mgr._io.all_ok
            )
        return local_format.write_process(directory, self.mgr.rank, self.paths, self.leaves)

    def finished(self) -> None:
        """orbax's thread never outlives the save (one whose tier was skipped included), so the
        next save and `close` find it done; its error was reported by `write` where it ran."""
        if self.orbax is not None:
            try:
                self.orbax.wait()
            except Exception as e:
                log.warning("kubeckpt: orbax's save of %s failed: %s", self.orbax.path, e)


class _JaxLoader:
    """The protocol's `Loader`: JAX arrays are immutable, so `apply` builds a new state and
    touches nothing live; the manager hands it back from `restore`."""

    def __init__(self, mgr: CheckpointManager, target: Any) -> None:
        self.mgr = mgr
        self.paths, self.targets = _paths(target)
        self.treedef = jax.tree_util.tree_structure(target)
        self.state: Any = None

    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> Any:
        fmt = _manifest_format(manifest)
        if manifest.world_size != self.mgr.world_size:
            raise ValueError(
                f"written by {manifest.world_size} processes, restoring on {self.mgr.world_size}"
            )
        if fmt == "orbax":
            orbax_format.check(path, self.paths)
            return fmt, None
        leaves = local_format.read_index(path, self.mgr.rank)
        if [d["path"] for d in leaves] != self.paths:
            raise ValueError("the checkpoint's state has another structure than the one to restore")
        return fmt, leaves

    def apply(self, prepared: Any, path: Path, manifest: Manifest, tier: Tier) -> None:
        fmt, leaves = prepared
        if fmt == "orbax":
            values = orbax_format.read(path, self.targets)
        else:
            values = local_format.read_process(path, self.mgr.rank, leaves, self.targets)
        self.state = jax.tree_util.tree_unflatten(self.treedef, values)


def _manifest_format(manifest: Manifest) -> str:
    info = manifest.extra.get("kubeckpt", {})
    return info.get("format", "orbax") if isinstance(info, dict) else "orbax"


class CheckpointManager(AdapterBase):
    def __init__(
        self,
        *,
        config: Config,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        persistent_format: str = "auto",
        snapshot: str = "auto",
    ) -> None:
        if persistent_format not in ("auto", "orbax", "local"):
            raise ValueError(
                f"persistent_format {persistent_format!r}: expected auto, orbax or local"
            )
        self._persistent_format = persistent_format
        self._snapshot = Snapshotter(snapshot)
        me = member(config.settings.local_dir)
        self.rank = me.rank
        self.world_size = me.world_size
        # Three namespaces, as torch has three groups: the per-step question, the writer thread's
        # save, the stop watcher's.
        self._comm, self._io, self._ctl = groups(config.enabled)
        self._start(
            config,
            framework=FRAMEWORK,
            me=me,
            comm=self._comm,
            io=self._io,
            total_steps=total_steps,
            total_epochs=total_epochs,
        )
        # JAX has no optimizer hook to hold updates with, so the watcher does not save on its
        # own: it spreads a stop to every process's next step boundary (stop/watcher.py).
        self._stop.start_watcher(self._ctl, None)

    @classmethod
    def from_env(
        cls,
        *,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        environ: Mapping[str, str] | None = None,
        persistent_format: str = "auto",
        snapshot: str = "auto",
        **overrides: Any,
    ) -> CheckpointManager:
        """Everything from the environment DESIGN.md defines; keyword overrides win.

        `persistent_format`: "auto" (orbax only where several processes write one shared
        directory, which kubeckpt's per-process format cannot), "orbax" (always, for tools that
        read orbax checkpoints) or "local". `snapshot`: "auto", "view" or "copy" (snapshot.py)."""
        return cls(
            config=Config.from_env(environ, **overrides),
            total_steps=total_steps,
            total_epochs=total_epochs,
            persistent_format=persistent_format,
            snapshot=snapshot,
        )

    # ------------------------------------------------------------------ restore

    def restore(self, state: Any) -> tuple[Any, int]:
        """(state, step): the newest complete checkpoint every process can load, built like
        `state` (same structure, each array on the target's sharding; `jax.ShapeDtypeStruct`
        leaves with a sharding will do), or `state` itself and 0 when there is none.

        Every process agrees on one step: a process whose local copy is missing or corrupt makes
        all of them use another checkpoint, never a different step each.
        """
        loader = _JaxLoader(self, state)
        restored = self._restore(loader, needs=local_format.index_file(self.rank))
        if restored is None:
            return state, 0
        self.epoch = restored.manifest.epoch
        return loader.state, restored.step

    # ------------------------------------------------------------------ per step

    def step_end(
        self,
        step: int,
        state: Any,
        *,
        epoch: int | None = None,
        loss: Any = None,
        learning_rate: Any = None,
        metrics: Mapping[str, Any] | None = None,
        end_of_epoch: bool = False,
    ) -> bool:
        """Call after each optimizer step with the number of steps done and the new state. Saves
        when due; returns True when the loop must stop (a just-in-time checkpoint was taken, or
        its attempt ended). `loss` may be a jax.Array: it is read only on progress writes."""
        return self._step_end(
            step,
            lambda blocking: self._stage(step, state),
            epoch=epoch,
            loss=loss,
            learning_rate=learning_rate,
            metrics=metrics,
            end_of_epoch=end_of_epoch,
        )

    def save(self, step: int, state: Any, *, blocking: bool = True) -> SaveResult | None:
        """Save now to the persistent tier (every process must call it at the same step)."""
        self.step = step
        return self._save(step, lambda: self._stage(step, state), blocking=blocking)

    def _stage(self, step: int, state: Any) -> _JaxSave:
        """On the training thread: a host snapshot for the tiers in kubeckpt's format, orbax's
        async save started for a tier in orbax's (its blocking part is the host transfers only;
        no copy on the device either way)."""
        paths, leaves = _paths(state)
        tiers = self._ckpt.staging_tiers
        pending = None
        orbax_tiers = [t for t in tiers if self._format(t) == "orbax"]
        if orbax_tiers:
            staging = orbax_format.staging_dir(orbax_tiers[0].write_dir(step).parent, step)
            pending = orbax_format.start(staging, leaves)
        host: list[Any] = []
        if any(self._format(t) == "local" for t in tiers):
            host = self._snapshot.take(leaves)
        save = _JaxSave(self, paths, host, pending)
        self._snapshot.hold(save, host)
        return save

    def _format(self, tier: Tier) -> str:
        """orbax for the persistent tier where several processes write into one shared
        directory (orbax writes one logical checkpoint), or where asked; elsewhere (one process,
        the ramdisk, `s3://` staged per node) each process's own part in the per-process format,
        written in one pass (hashed while written, one fsync), which the core's storage uploads."""
        if tier.name != "persistent" or self._persistent_format == "local":
            return "local"
        if self._persistent_format == "orbax":
            return "orbax"
        return "orbax" if isinstance(tier, LocalTier) and self.world_size > 1 else "local"

    def _manifest_extra(self, tier: Tier, reports: list[Report]) -> dict[str, Any]:
        return {
            "kubeckpt": {
                "format": self._format(tier),
                "ranks": sorted(r.rank for r in reports),
                "jax": jax.__version__,
            }
        }

    # ------------------------------------------------------------------ progress

    def _scalars(self, loss: Any, learning_rate: Any) -> tuple[Any, Any]:
        return (
            None if loss is None else float(loss),
            None if learning_rate is None else float(learning_rate),
        )
