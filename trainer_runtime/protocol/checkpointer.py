"""The save protocol every framework adapter drives (torch, the HF Trainer, JAX): it schedules,
saves and restores.

    ckpt = Checkpointer(config, framework="pytorch", comm=..., io=..., me=Member(...))
    restored = ckpt.restore(loader)              # the newest complete checkpoint, agreed, and
                                                 # the generation this run writes (plan)
    ...each optimizer step...
    ckpt.observe(step)
    d = ckpt.decide(step, stop_vote=asked)       # stop / persistent / local, agreed (pipelined)
    if d.persistent or d.local: ckpt.save(step, stage, persistent=..., local=...)
    ckpt.close()

The adapter supplies only what is framework-specific: an `Agreement` over its collectives (two:
one for the training thread's per-step question, one for the writer thread), a `stage` callable
that copies its state and returns a `Staged` (prepare + write this rank's files), and a `Loader`.
Everything else (the schedule, one save in flight, the commit over each tier, retention, resume
across tiers, failure accounting, progress) is here, once. The just-in-time stop, which votes in
`decide` and saves through `save`, is trainer_runtime.stop.JitStop; adapters go through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..contract import (
    MANIFEST_PEER_COPY,
    MANIFEST_REASON,
    REASON_PERIODIC,
    Manifest,
    ManifestFile,
    ProgressRecord,
    checkpoint_rel_path,
    format_rfc3339,
)
from ..contract.env import ON_UNVERIFIABLE_FAIL
from ..generations import choose_generation, highest_sequence
from ..peer_copy.service import TIER_LABEL as PEER_COPY_TIER
from ..peer_copy.service import PeerCopy
from ..progress_writer import ProgressWriter
from ..storage import LocalTier, Tier, persistent_tier
from ..timing import Schedule, StepTimer
from .agreement import Agreement
from .commit import Member, Report
from .resume import Loader, Restored, candidates, remove_incomplete, restore, same_world_size
from .resume_outcome import STARTED_FRESH, Action, ResumeDecision, ResumeRefused, decide_resume
from .session import SaveResult, SaveSession, Staged

log = logging.getLogger("trainer_runtime.protocol")

# (tier, reports) -> extra manifest keys, e.g. {"kubeckpt": {"format": "dcp"}}
ManifestExtra = Callable[[Tier, list[Report]], dict[str, Any]]


@dataclass
class StepDecision:
    stop: bool = False
    persistent: bool = False
    local: bool = False


class Checkpointer:
    def __init__(
        self,
        config: Config,
        *,
        framework: str,
        comm: Agreement,
        io: Agreement,
        me: Member,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        manifest_extra: ManifestExtra | None = None,
    ) -> None:
        self.config = config
        s = config.settings
        self.framework = framework
        self.me = me
        self.comm = comm
        self.io = io
        self.enabled = config.enabled
        self._agreement = comm.pipelined()
        self._manifest_extra = manifest_extra

        self.persistent: Tier | None = None
        self.local: LocalTier | None = None
        if self.enabled:
            assert s.checkpoint_uri is not None  # RuntimeSettings guarantees it when enabled
            self.persistent = persistent_tier(s.checkpoint_uri, config.resolved_staging_dir())
            if s.local_dir:
                self.local = LocalTier(s.local_dir, "local")
        # Peer copies of the ramdisk tier (peer_copy/): set up at the first collective point.
        self.peer: PeerCopy | None = None
        if self.local is not None and config.local_peer:
            self.peer = PeerCopy(self.local, me, config.pod_ip)

        self.progress = ProgressWriter(
            s.progress_file,
            enabled=me.rank == 0,
            every=s.progress_update_frequency,
            total_steps=total_steps,
            total_epochs=total_epochs,
            checkpointing_enabled=self.enabled,
            termination_log=config.termination_log,
        )
        self.schedule = Schedule(s, local_enabled=self.local is not None)
        self.timer = StepTimer()
        self.session = SaveSession(
            io,
            me,
            manifest=self.manifest,
            keep=self._keep,
            on_result=self._on_result,
            spares=lambda tier: self._peer if tier is self.local else None,
        )

        self.step = 0
        self.epoch = 0
        # The tiers of the save being staged, for an adapter whose staging depends on them (JAX
        # starts orbax's own async save for a tier in orbax's format).
        self.staging_tiers: list[Tier] = []
        self.closed = False
        self.resumed: Restored | None = None
        self.last_result: SaveResult | None = None
        self.last_error: str | None = None
        self.failed_saves = 0
        # Retention of the persistent tier (the HF adapter adopts the Trainer's save_total_limit).
        self.keep_persistent = s.max_checkpoints
        self.durable_step: int | None = None  # newest step known saved in the persistent tier
        self.durable_location: str | None = None
        self._agreement_done = False  # the per-step agreement's last round was collected
        self._planned = False  # plan() ran: the generation and the commit order are known
        # False when plan() could not list the persistent tier: nothing there is deleted then,
        # since what belongs to another run is unknown.
        self._persistent_retention = True

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        loader: Loader,
        *,
        local_usable: Callable[[Tier, int], bool] | None = None,
        keep_fetched: bool = False,
    ) -> Restored | None:
        """Load the newest complete checkpoint every rank can load (None: start from scratch),
        when CHECKPOINT_RESUME is on; then `plan` the generation this run writes. Every rank
        calls it, resume on or off."""
        if not self.enabled:
            return None
        resume = self.config.settings.resume
        # Also without resume: a save in flight of a pod being replaced decides whether there
        # are checkpoints to keep apart from (a new generation), and leftovers go.
        remove_incomplete(self.io, self.me, self.persistent, self.local)
        restored = None
        if (peer := self._peer) is not None:
            peer.setup(self.io)
        if resume:
            if peer is not None:
                peer.recover(self.io)  # a node's lost copy, back from its ring successor
            found = candidates(
                self.io,
                self.me,
                self.persistent,
                self.local,
                local_usable or same_world_size(self.me),
            )
            restored, outcome = restore(
                self.io,
                self.me,
                found,
                loader,
                checksums=self.config.should_verify_checksums,
                keep_fetched=keep_fetched,
                unverifiable_stops=self.config.settings.on_unverifiable == ON_UNVERIFIABLE_FAIL,
            )
            self._act_on(decide_resume(outcome, self.config.settings.on_unverifiable))
        self.plan(resumed=restored is not None, restored=restored.generation if restored else None)
        if restored is None:
            if resume:
                log.info("kubeckpt: no usable checkpoint, starting from step 0")
            return None
        self.resumed = restored
        self.step = restored.step
        self.epoch = restored.manifest.epoch
        self.progress.resumed(
            self.resumed_name or "",
            restored.location,
            restored.manifest.time,
            tier=self.resumed_tier,
        )
        if restored.tier is self.persistent:
            self.durable_step = restored.step
            self.durable_location = restored.location
        self.schedule.restart_interval()
        log.info("kubeckpt: resumed from %s (%s tier)", restored.location, self.resumed_tier)
        return restored

    @property
    def _peer(self) -> PeerCopy | None:
        """The peer copies, while the local tier they copy is on (an adapter may turn it off
        after construction: the HF Trainer's on several nodes)."""
        peer = self.peer
        return peer if peer is not None and peer.local is self.local else None

    @property
    def resumed_tier(self) -> str | None:
        """The tier the run resumed from: "local", "persistent", or "local (peer copy)" where a
        node's part of the local checkpoint came back from its ring successor's copy."""
        r = self.resumed
        if r is None:
            return None
        peer = self._peer
        if r.tier is self.local and peer is not None and r.step in peer.fetched.values():
            return PEER_COPY_TIER
        return r.tier.name

    def _act_on(self, decision: ResumeDecision) -> None:
        """Log what restore passed over; record it for the controller (the progress file and the
        termination message: condition CheckpointsUnverifiable); end the process on FAIL. Every
        rank decides alike (the outcome was agreed), so every rank exits alike."""
        if decision.reason is not None:
            started = decision.action is Action.START_FRESH
            self.progress.resume_refused(
                STARTED_FRESH if started else decision.reason, decision.message
            )
        if decision.action is Action.FAIL:
            log.error("kubeckpt: %s", decision.message)
            self.progress.write_final(self.progress.build(0))
            raise ResumeRefused(decision)
        if decision.message:
            log.warning("kubeckpt: %s", decision.message)

    @property
    def resumed_name(self) -> str | None:
        """What the run resumed from, relative to its tier's root: `checkpoint-<step>`, or
        `generation-<N>/checkpoint-<step>` in a later generation (the progress record's
        resumedFrom)."""
        r = self.resumed
        if r is None:
            return None
        persistent = r.tier is self.persistent and r.generation is not None
        return checkpoint_rel_path(r.step, r.generation if persistent else 0)

    def plan(self, *, resumed: bool = False, restored: int | None = None) -> None:
        """Decide once, the same on every rank, the generation this run writes and where its
        commit order starts (generations.py). `restore` calls it; `save` does for an adapter
        that saves without restoring. Collective (every rank calls it at the same point)."""
        if self._planned or not self.enabled:
            return
        self._planned = True
        if (peer := self._peer) is not None:  # an adapter that saves without having restored
            peer.setup(self.io)
        decided: tuple[int, int] | None = None  # (generation, highest sequence), rank 0's
        if self.persistent is not None and self.me.rank == 0:
            tier = self.persistent
            try:
                entries = tier.with_sequences([e for e in tier.scan() if e.complete])
                generation = choose_generation(
                    entries,
                    resume=self.config.settings.resume,
                    resumed=resumed,
                    restored=restored,
                    existing=tier.generations(),
                )
                decided = (generation, highest_sequence(entries))
            except Exception as e:
                log.warning(
                    "kubeckpt: cannot list %s (%s): no retention there in this run, so that "
                    "nothing of another run is deleted",
                    tier,
                    e,
                )
        local_highest = 0
        if self.local is not None and self.me.local_rank == 0:
            try:
                local = self.local
                local_highest = highest_sequence(
                    local.with_sequences([e for e in local.scan() if e.complete])
                )
            except Exception as e:
                log.warning("kubeckpt: cannot list %s: %s", self.local, e)
        try:
            decided = self.io.broadcast(decided)
            highest = max(self.io.all_gather(local_highest), default=0)
        except Exception as e:  # a rank gone: the save that follows fails and says so
            log.warning("kubeckpt: cannot agree on the generation to write: %s", e)
            decided, highest = None, local_highest
        generation = 0
        if decided is None:
            self._persistent_retention = False
        else:
            generation, persistent_highest = decided
            highest = max(highest, persistent_highest)
        self.session.sequence = max(self.session.sequence, highest)
        self.session.generation = generation
        if self.persistent is not None:
            self.persistent.generation = generation
            if generation and self.me.rank == 0:
                log.info(
                    "kubeckpt: writing generation %d: %s",
                    generation,
                    self.persistent.location(0).rsplit("/", 1)[0],
                )

    # ------------------------------------------------------------------ per step

    def observe(self, step: int) -> None:
        """An optimizer step ended: the step count, and the step time progress reports."""
        self.step = step
        self.timer.observe(step)

    def decide(
        self,
        step: int,
        *,
        stop_vote: bool = False,
        end_of_epoch: bool = False,
        also_persistent: bool = False,
    ) -> StepDecision:
        """At the end of an optimizer step (after `observe`): stop, save, or go on, the same on
        every rank. `stop_vote`: this rank was asked to stop (trainer_runtime.stop votes it).

        The stop question is pipelined (answered one step later, never waited for); a due save
        is decided at once where every rank computes the same answer (step counts, epochs, the
        framework's own schedule: `also_persistent`) and by rank 0's clock for the time strategy.
        """
        self.session.reap()
        if not self.enabled:
            return StepDecision()
        decision = self.schedule.decide(step, end_of_epoch=end_of_epoch)
        timed = self.config.settings.checkpoint_strategy == "time"
        # The time strategy reads the clock: only rank 0's reading counts, or ranks disagree.
        vote = timed and decision.persistent and self.me.rank == 0
        if vote:
            self.schedule.restart_interval()  # one vote per interval, not one per step
        agreed = self._agreement.exchange([int(stop_vote), int(vote)])
        stop = bool(agreed and agreed[0])
        persistent = bool(agreed and agreed[1]) if timed else decision.persistent
        return StepDecision(
            stop=stop, persistent=persistent or also_persistent, local=decision.local
        )

    def tiers(self, *, persistent: bool, local: bool) -> list[Tier]:
        out: list[Tier] = []
        if local and self.local is not None:
            out.append(self.local)
        if persistent and self.persistent is not None:
            out.append(self.persistent)
        return out

    def save(
        self,
        step: int,
        stage: Callable[[], Staged],
        *,
        persistent: bool = True,
        local: bool = False,
        reason: str = REASON_PERIODIC,
        blocking: bool = False,
        epoch: int | None = None,
    ) -> SaveResult | None:
        """Stage now (the training thread waits for that only) and persist on the writer thread.
        Every rank must call it at the same step. With `blocking`, the result."""
        self.session.wait()  # a new save waits for the previous one
        self.plan()  # an adapter that saves without having restored
        tiers = self.tiers(persistent=persistent, local=local)
        if not tiers:
            return None
        started = time.monotonic()
        self.staging_tiers = tiers
        # The node's own local save first: its peer copies pause until it is written.
        peer = self._peer if any(t is self.local for t in tiers) else None
        if peer is not None:
            peer.gate.hold()
        try:
            staged = stage()
        except BaseException:
            if peer is not None:
                peer.gate.release()
            raise
        stall = time.monotonic() - started
        if persistent:
            self.schedule.restart_interval()
        return self.session.submit(
            staged,
            step,
            self.epoch if epoch is None else epoch,
            tiers,
            reason=reason,
            started=started,
            stall=stall,
            blocking=blocking,
            written=peer.gate.release if peer is not None else None,
        )

    def end_agreement(self, *, rejoin: bool = False) -> None:
        """Collect the per-step agreement's round in flight, once (a stop does it as soon as its
        checkpoint is durable, `close` otherwise). `rejoin`: this rank's training thread was away
        while the others voted (the stop watcher saved for it): it votes stop in one more round
        first, as every rank did."""
        if self._agreement_done:
            return
        self._agreement_done = True
        if rejoin:
            self._agreement.exchange([1, 0])
        self._agreement.collect()

    def record(self, result: SaveResult) -> None:
        """Account for a save the adapter made itself through `session.commit(...)`."""
        self._on_result(result)

    def count_failure(self, step: int, error: str | None, *, prefix: str = "") -> None:
        """A save that failed (or a stop that could not save): counted, and said in the progress
        record (with `prefix`)."""
        self.failed_saves += 1
        self.last_error = error
        self.progress.checkpoint_failed(step, prefix + (error or "unknown error"))

    # ------------------------------------------------------------------ results

    def _keep(self, tier: Tier) -> int | None:
        """Retention of `tier` (None: none this run, see plan)."""
        if tier.name == "local":
            return self.config.local_keep
        return max(1, self.keep_persistent) if self._persistent_retention else None

    def manifest(
        self,
        tier: Tier,
        step: int,
        epoch: int,
        reports: list[Report],
        reason: str = REASON_PERIODIC,
    ) -> Manifest:
        """The manifest of a save: every file the ranks reported, with its size and checksum,
        and why the checkpoint was written (`kubeckpt checkpoints` lists it)."""
        files: dict[str, ManifestFile] = {}
        for report in reports:
            for path, size, checksum in report.files:
                files[path] = ManifestFile.from_checksum(path, size, checksum)
        extra = self._manifest_extra(tier, reports) if self._manifest_extra else {}
        extra[MANIFEST_REASON] = reason
        if tier is self.local and (peer := self._peer) is not None:
            # Where this node's copy is sent (the successor verifies it before keeping it).
            if (where := peer.successor_record()) is not None:
                extra[MANIFEST_PEER_COPY] = where
        return Manifest(
            step=step,
            epoch=epoch,
            time=format_rfc3339(),
            world_size=self.me.world_size,
            framework=self.framework,
            tier=tier.name,
            files=[files[p] for p in sorted(files)],
            extra=extra,
        )

    def _on_result(self, result: SaveResult) -> None:
        self.last_result = result
        if not result.ok:
            log.error("kubeckpt: checkpoint at step %d failed: %s", result.step, result.error)
            self.count_failure(result.step, result.error)
            return
        if "persistent" in result.locations:
            self.durable_step = result.step
            self.durable_location = result.locations["persistent"]
            self.progress.checkpoint_saved(
                result.locations["persistent"],
                save_seconds=result.save_seconds,
                stall_seconds=result.stall_seconds,
                reason=result.reason,
            )
        if "local" in result.locations:
            self.progress.local_checkpoint_saved(result.locations["local"])
            if (peer := self._peer) is not None:
                peer.offer(result.step)  # on its own thread: training goes on

    # ------------------------------------------------------------------ progress and shutdown

    def write_progress(self, record: ProgressRecord, *, final: bool = False) -> None:
        if final:
            self.progress.write_final(record)
        else:
            self.progress.write(record)

    def close(self) -> None:
        """The per-step agreement's last round, then the save in flight. Idempotent (JitStop.close
        calls it on the way out, between the watcher and the signals)."""
        if self.closed:
            return
        self.closed = True
        self.end_agreement()
        self.session.shutdown()
        if self.peer is not None:
            self.peer.close()
