"""Runtime configuration: DESIGN.md's environment (RuntimeSettings) plus a few in-pod knobs.

`Config.from_env(**overrides)` reads the environment with the contract's parser and defaults; any
keyword overrides a field, either of RuntimeSettings (e.g. `max_checkpoints=5`) or of Config
itself (e.g. `async_save=False`), so a training script can pin a value in code.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .contract import KUBECKPT_JOB_KIND, ContractError, RuntimeSettings
from .contract.env import CHECKPOINT_LOCAL_PEER, KUBECKPT_POD_IP
from .contract.jobkinds import JOB_KINDS, job_kind

log = logging.getLogger(__name__)

# Runtime-only variables: not part of the webhook contract, so they live here, not in contract/.
KUBECKPT_ASYNC_SAVE: Final = "KUBECKPT_ASYNC_SAVE"
KUBECKPT_VERIFY_CHECKSUMS: Final = "KUBECKPT_VERIFY_CHECKSUMS"
KUBECKPT_TERMINATION_LOG: Final = "KUBECKPT_TERMINATION_LOG"
KUBECKPT_STAGING_DIR: Final = "KUBECKPT_STAGING_DIR"
KUBECKPT_LOCAL_KEEP: Final = "KUBECKPT_LOCAL_KEEP"
KUBECKPT_PRESTOP_TIMEOUT: Final = "KUBECKPT_PRESTOP_TIMEOUT"
KUBECKPT_STOP_TAKEOVER_SECONDS: Final = "KUBECKPT_STOP_TAKEOVER_SECONDS"
KUBECKPT_STAGING_BUDGET_BYTES: Final = "KUBECKPT_STAGING_BUDGET_BYTES"

DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
# On restore, "auto" (the default) and "always" check every file's size and content checksum, at
# any size: with XXH3 (~13 GB/s a core) hashing a gigabyte costs less than reading it from the
# page cache. "never" checks sizes only.
VERIFY_MODES: Final = ("auto", "always", "never")


def _parse_bool(name: str, raw: str) -> bool:
    # The same spellings RuntimeSettings accepts for its booleans.
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ContractError(f"{name}: expected true/false/1/0/yes/no, got {raw!r}", field=name)


@dataclass(frozen=True, kw_only=True)
class Config:
    settings: RuntimeSettings
    # Stage to memory and persist in a background thread (False: every save blocks until durable).
    async_save: bool = True
    # Overlap the copy of parameters and optimizer state with the next forward/backward; the next
    # optimizer.step() waits for it. Safe as long as only optimizer.step() changes them.
    overlap_staging: bool = True
    verify_checksums: str = "auto"
    termination_log: str = DEFAULT_TERMINATION_LOG
    staging_dir: str | None = None  # s3:// uploads and downloads go through here
    local_keep: int = 1  # the ramdisk is sized for one complete checkpoint plus one in progress
    # A stop pending this long with no step boundary is saved by the stop watcher (None: a few
    # step times, within a quarter of the grace period; see protocol/watcher.py).
    stop_takeover_seconds: float | None = None
    stop_poll_seconds: float = 0.5
    # Host memory an async save may stage (staging_budget.py); None: what fits under the
    # container's memory limit beside the process's own use, read at each save.
    staging_budget_bytes: int | None = None
    # Peer copies of the ramdisk tier (CHECKPOINT_LOCAL_PEER, peer_copy/): each node's local
    # checkpoint is also kept by its ring successor; `pod_ip` is where this node serves them.
    local_peer: bool = False
    pod_ip: str | None = None

    def __post_init__(self) -> None:
        if self.verify_checksums not in VERIFY_MODES:
            raise ContractError(
                f"{KUBECKPT_VERIFY_CHECKSUMS}: must be one of {', '.join(VERIFY_MODES)}, "
                f"got {self.verify_checksums!r}",
                field=KUBECKPT_VERIFY_CHECKSUMS,
            )
        budget = self.staging_budget_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise ContractError(
                f"{KUBECKPT_STAGING_BUDGET_BYTES}: expected an integer >= 0",
                field=KUBECKPT_STAGING_BUDGET_BYTES,
            )
        if budget is not None and budget < 0:
            raise ContractError(
                f"{KUBECKPT_STAGING_BUDGET_BYTES}: expected an integer >= 0, got {budget}",
                field=KUBECKPT_STAGING_BUDGET_BYTES,
            )
        if isinstance(self.local_keep, bool) or not isinstance(self.local_keep, int):
            raise ContractError(f"{KUBECKPT_LOCAL_KEEP}: expected an integer >= 1")
        if self.local_keep < 1:
            raise ContractError(f"{KUBECKPT_LOCAL_KEEP}: expected an integer >= 1")
        kind = self.settings.job_kind
        if kind is not None and job_kind(kind) is None:
            # Not an error: checkpoints work the same; only the controller will not follow it.
            log.warning(
                "kubeckpt: %s=%r is not a job kind kubeckpt knows (%s): no TrainingProgress",
                KUBECKPT_JOB_KIND,
                kind,
                ", ".join(k.kind for k in JOB_KINDS),
            )

    @property
    def enabled(self) -> bool:
        return self.settings.checkpoint_enabled

    @property
    def is_remote(self) -> bool:
        uri = self.settings.checkpoint_uri or ""
        return "://" in uri and not uri.startswith("file://")

    def resolved_staging_dir(self) -> str:
        if self.staging_dir:
            return self.staging_dir
        job = self.settings.job_name or "job"
        return os.path.join(tempfile.gettempdir(), f"kubeckpt-staging-{job}")

    def should_verify_checksums(self, total_bytes: int) -> bool:
        """Whether restore checks content as well as sizes (`total_bytes` no longer matters)."""
        return self.verify_checksums != "never"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        env = os.environ if environ is None else environ
        settings = RuntimeSettings.from_env(env)
        setting_names = {f.name for f in dataclasses.fields(RuntimeSettings)}
        own_names = {f.name for f in dataclasses.fields(cls)} - {"settings"}
        unknown = set(overrides) - setting_names - own_names
        if unknown:
            raise TypeError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        setting_overrides = {k: v for k, v in overrides.items() if k in setting_names}
        if setting_overrides:
            settings = dataclasses.replace(settings, **setting_overrides)

        def get(name: str) -> str | None:
            raw = env.get(name)
            return raw.strip() if raw is not None and raw.strip() else None

        kwargs: dict[str, Any] = {"settings": settings}
        if (raw := get(KUBECKPT_ASYNC_SAVE)) is not None:
            kwargs["async_save"] = _parse_bool(KUBECKPT_ASYNC_SAVE, raw)
        if (raw := get(KUBECKPT_VERIFY_CHECKSUMS)) is not None:
            kwargs["verify_checksums"] = raw.lower()
        if (raw := get(KUBECKPT_TERMINATION_LOG)) is not None:
            kwargs["termination_log"] = raw
        if (raw := get(KUBECKPT_STAGING_DIR)) is not None:
            kwargs["staging_dir"] = raw
        if (raw := get(KUBECKPT_LOCAL_KEEP)) is not None:
            if not raw.isdigit():
                raise ContractError(f"{KUBECKPT_LOCAL_KEEP}: expected an integer >= 1, got {raw!r}")
            kwargs["local_keep"] = int(raw)
        if (raw := get(KUBECKPT_STOP_TAKEOVER_SECONDS)) is not None:
            try:
                kwargs["stop_takeover_seconds"] = max(0.0, float(raw))
            except ValueError:
                raise ContractError(
                    f"{KUBECKPT_STOP_TAKEOVER_SECONDS}: expected seconds, got {raw!r}"
                ) from None
        if (raw := get(KUBECKPT_STAGING_BUDGET_BYTES)) is not None:
            if not raw.isdigit():
                raise ContractError(
                    f"{KUBECKPT_STAGING_BUDGET_BYTES}: expected a number of bytes >= 0, "
                    f"got {raw!r}",
                    field=KUBECKPT_STAGING_BUDGET_BYTES,
                )
            kwargs["staging_budget_bytes"] = int(raw)
        if (raw := get(CHECKPOINT_LOCAL_PEER)) is not None:
            kwargs["local_peer"] = _parse_bool(CHECKPOINT_LOCAL_PEER, raw)
        if (raw := get(KUBECKPT_POD_IP)) is not None:
            kwargs["pod_ip"] = raw
        kwargs.update({k: v for k, v in overrides.items() if k in own_names})
        return cls(**kwargs)
