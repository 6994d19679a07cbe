"""Environment variables and well-known file names shared by the webhook and the runtime.

The webhook writes these variables into training pods; the runtime reads them with
`RuntimeSettings.from_env()`. Both sides import the names from here so they cannot drift apart.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .errors import ContractError, describe

# --- variable names (DESIGN.md, "Environment") ---------------------------------------------------

TRAINING_PROGRESS_FILE: Final = "TRAINING_PROGRESS_FILE"
CHECKPOINT_ENABLED: Final = "CHECKPOINT_ENABLED"
CHECKPOINT_URI: Final = "CHECKPOINT_URI"
CHECKPOINT_INTERVAL: Final = "CHECKPOINT_INTERVAL"
CHECKPOINT_STRATEGY: Final = "CHECKPOINT_STRATEGY"
CHECKPOINT_SAVE_STEPS: Final = "CHECKPOINT_SAVE_STEPS"
CHECKPOINT_MAX_CHECKPOINTS: Final = "CHECKPOINT_MAX_CHECKPOINTS"
CHECKPOINT_RESUME: Final = "CHECKPOINT_RESUME"
CHECKPOINT_JIT: Final = "CHECKPOINT_JIT"
CHECKPOINT_LOCAL_DIR: Final = "CHECKPOINT_LOCAL_DIR"
CHECKPOINT_LOCAL_PERIOD: Final = "CHECKPOINT_LOCAL_PERIOD"
CHECKPOINT_CONTROL_DIR: Final = "CHECKPOINT_CONTROL_DIR"
PROGRESS_UPDATE_FREQUENCY: Final = "PROGRESS_UPDATE_FREQUENCY"
TORCH_ELASTIC_SHUTDOWN_TIMEOUT: Final = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
KUBECKPT_JOB_KIND: Final = "KUBECKPT_JOB_KIND"
KUBECKPT_JOB_NAME: Final = "KUBECKPT_JOB_NAME"
KUBECKPT_NAMESPACE: Final = "KUBECKPT_NAMESPACE"
# An extension (docs/contract.md), not one of DESIGN.md's variables: what a run does when
# checkpoints exist but none verifies (the policy's `onUnverifiableCheckpoints`).
CHECKPOINT_ON_UNVERIFIABLE: Final = "CHECKPOINT_ON_UNVERIFIABLE"

ALL_ENV_VARS: Final = (
    TRAINING_PROGRESS_FILE,
    CHECKPOINT_ENABLED,
    CHECKPOINT_URI,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_STRATEGY,
    CHECKPOINT_SAVE_STEPS,
    CHECKPOINT_MAX_CHECKPOINTS,
    CHECKPOINT_RESUME,
    CHECKPOINT_JIT,
    CHECKPOINT_LOCAL_DIR,
    CHECKPOINT_LOCAL_PERIOD,
    CHECKPOINT_CONTROL_DIR,
    PROGRESS_UPDATE_FREQUENCY,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    KUBECKPT_JOB_KIND,
    KUBECKPT_JOB_NAME,
    KUBECKPT_NAMESPACE,
)

# Progress push (issue 26), injected only when the policy sets progress.push; not in ALL_ENV_VARS:
# the runtime pushes when it finds them, and nothing else depends on them. Trainer's names (what
# transformers' KubeflowCallback reads) are injected beside ours unless Trainer set them itself.
KUBECKPT_PROGRESS_PUSH_URL: Final = "KUBECKPT_PROGRESS_PUSH_URL"
KUBECKPT_PROGRESS_PUSH_TOKEN: Final = "KUBECKPT_PROGRESS_PUSH_TOKEN"
KUBECKPT_PROGRESS_PUSH_CA: Final = "KUBECKPT_PROGRESS_PUSH_CA"
KUBEFLOW_TRAINER_SERVER_URL: Final = "KUBEFLOW_TRAINER_SERVER_URL"
KUBEFLOW_TRAINER_SERVER_TOKEN: Final = "KUBEFLOW_TRAINER_SERVER_TOKEN"
KUBEFLOW_TRAINER_SERVER_CA_CERT: Final = "KUBEFLOW_TRAINER_SERVER_CA_CERT"

# Peer copies of the ramdisk tier (issue 28, the policy's `localTier.peerCopy`), injected only when
# it and the local tier are on; not in ALL_ENV_VARS, like the progress push's. KUBECKPT_POD_IP is
# the pod's IP (downward API status.podIP): where the node's peer copy server listens.
CHECKPOINT_LOCAL_PEER: Final = "CHECKPOINT_LOCAL_PEER"
KUBECKPT_POD_IP: Final = "KUBECKPT_POD_IP"

# --- well-known paths and file names -------------------------------------------------------------

RUN_DIR: Final = "/var/run/kubeckpt"  # the injected emptyDir for progress and control files
POD_PROGRESS_FILE: Final = f"{RUN_DIR}/progress.json"  # what the webhook injects
POD_LOCAL_DIR: Final = f"{RUN_DIR}/local"  # where the webhook mounts the ramdisk tier
REQUEST_FILE: Final = "checkpoint-request"  # preStop -> runtime
DONE_FILE: Final = "checkpoint-done"  # runtime -> preStop: saved
FAILED_FILE: Final = "checkpoint-failed"  # runtime -> preStop: gave up
INCOMPLETE_SENTINEL: Final = "checkpoint-is-incomplete.txt"  # the name HF and the Kubeflow SDK use
MANIFEST_FILE: Final = "manifest.json"
CHECKPOINT_DIR_PREFIX: Final = "checkpoint-"  # HF Trainer naming, so HF tools read our checkpoints
# A run that does not resume while complete checkpoints exist writes `generation-<N>/` beside them
# (the root itself is generation 0), so it never deletes an earlier run's checkpoints.
GENERATION_DIR_PREFIX: Final = "generation-"

# --- defaults (match the CheckpointPolicy defaults) ----------------------------------------------

DEFAULT_PROGRESS_FILE: Final = "/workspace/training_progress.json"
DEFAULT_CHECKPOINT_ENABLED: Final = False
DEFAULT_CHECKPOINT_INTERVAL: Final = 300.0  # seconds (policy default "5m")
DEFAULT_CHECKPOINT_STRATEGY: Final = "time"
DEFAULT_MAX_CHECKPOINTS: Final = 3
DEFAULT_RESUME: Final = True
DEFAULT_JIT: Final = True
DEFAULT_LOCAL_PERIOD: Final = 100
# The exit status of a training process that stopped for a just-in-time checkpoint (128 + SIGTERM,
# as if the signal had ended it). Not 0: job controllers read 0 as success even while the pod is
# being deleted by a preemption (the training-operator marks the PyTorchJob Succeeded when its
# master pod succeeds, a Job counts a completion), and the preempted job would end there. 143 is
# retryable for restartPolicy OnFailure and ExitCode, and for a Job's podFailurePolicy.
PREEMPTED_EXIT_CODE: Final = 143
# CHECKPOINT_ON_UNVERIFIABLE: stop the process (the default) or start from step 0 with a warning.
ON_UNVERIFIABLE_FAIL: Final = "Fail"
ON_UNVERIFIABLE_START_FRESH: Final = "StartFresh"
ON_UNVERIFIABLE_VALUES: Final = (ON_UNVERIFIABLE_FAIL, ON_UNVERIFIABLE_START_FRESH)
DEFAULT_ON_UNVERIFIABLE: Final = ON_UNVERIFIABLE_FAIL
# The exit status of a process that found checkpoints of which none verifies (EX_DATAERR), and of
# one that found a checkpoint of a format version it does not know (EX_CONFIG: the image is too
# old). Distinct from 1 and 143 so a Job's podFailurePolicy can act on them (retrying reads the
# same bad files again).
UNVERIFIABLE_EXIT_CODE: Final = 65
UNSUPPORTED_FORMAT_EXIT_CODE: Final = 78
DEFAULT_CONTROL_DIR: Final = RUN_DIR
DEFAULT_PROGRESS_UPDATE_FREQUENCY: Final = 5

STRATEGIES: Final = ("time", "steps", "epoch")

# --- checkpoint directory names ------------------------------------------------------------------

# Canonical decimal only: "checkpoint-0100" and "checkpoint-100" must not both claim step 100.
_CHECKPOINT_DIR_RE = re.compile(r"checkpoint-(0|[1-9][0-9]*)")


def checkpoint_dir_name(step: int) -> str:
    """`checkpoint-<step>`, the directory a checkpoint at `step` lives in."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ContractError(
            f"step: expected a non-negative integer, got {describe(step)}", field="step"
        )
    return f"{CHECKPOINT_DIR_PREFIX}{step}"


def parse_checkpoint_dir_name(name: str) -> int | None:
    """The step of a `checkpoint-<step>` directory name, or None for any other name."""
    m = _CHECKPOINT_DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


# Canonical decimal, from 1: generation 0 is CHECKPOINT_URI itself, never `generation-0/`.
_GENERATION_DIR_RE = re.compile(r"generation-([1-9][0-9]{0,18})")


def generation_dir_name(generation: int) -> str:
    """`generation-<N>`, the directory of generation N >= 1 under CHECKPOINT_URI."""
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise ContractError(
            f"generation: expected an integer >= 1, got {describe(generation)}", field="generation"
        )
    return f"{GENERATION_DIR_PREFIX}{generation}"


def parse_generation_dir_name(name: str) -> int | None:
    """The N of a `generation-<N>` directory name (N >= 1), or None for any other name."""
    m = _GENERATION_DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def checkpoint_rel_path(step: int, generation: int = 0) -> str:
    """Where checkpoint `step` of `generation` lives, relative to CHECKPOINT_URI:
    `checkpoint-<step>` (generation 0) or `generation-<N>/checkpoint-<step>`."""
    name = checkpoint_dir_name(step)
    return name if generation == 0 else f"{generation_dir_name(generation)}/{name}"


# --- durations -----------------------------------------------------------------------------------

_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign, as Go accepts
    "\u03bcs": 1e-6,  # Greek mu, as Go accepts
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Longer units first so "ms" is not read as "m" followed by garbage.
_DURATION_PART_RE = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_PLAIN_NUMBER_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string (`time.ParseDuration` syntax): "5m", "1h2m3.5s", "250ms".

    Like Go: an optional sign, then one or more <decimal><unit> parts; "0" alone is allowed;
    units are ns, us (µs), ms, s, m, h. Raises ContractError (a ValueError) otherwise.
    """
    if not isinstance(text, str):
        raise ContractError(f"expected a duration string, got {describe(text)}")
    s = text
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ContractError(f"invalid duration {describe(text)}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART_RE.match(s, pos)
        number = m.group(1) if m else ""
        if m is None or number in ("", "."):
            raise ContractError(f"invalid duration {describe(text)}: expected <number><unit>")
        total += float(number) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not math.isfinite(total):
        raise ContractError(f"invalid duration {describe(text)}: out of range")
    return sign * total


def format_duration(seconds: float) -> str:
    """A compact Go-parsable duration ("45m", "1h2m3.5s", "250ms"), rounded to milliseconds.

    Used for human-facing fields such as the progress record's estimatedTimeRemaining.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ContractError(f"expected a number of seconds, got {describe(seconds)}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ContractError(f"duration must be finite and >= 0, got {describe(seconds)}")
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    hours, rem = divmod(ms, 3_600_000)
    minutes, rem = divmod(rem, 60_000)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if rem:
        if rem % 1000 == 0:
            parts.append(f"{rem // 1000}s")
        elif not parts and rem < 1000:
            parts.append(f"{rem}ms")
        else:
            parts.append(f"{rem / 1000:.3f}".rstrip("0") + "s")
    return "".join(parts)


def _parse_seconds(text: str) -> float:
    """Plain seconds ("300", "2.5") or a Go duration ("5m")."""
    if _PLAIN_NUMBER_RE.fullmatch(text):
        value = float(text)
        if not math.isfinite(value):
            raise ContractError(f"invalid duration {describe(text)}: out of range")
        return value
    return parse_duration(text)


def _format_seconds(value: float) -> str:
    # Plain seconds, as the Environment table shows; repr() keeps a float exact for round trips.
    return (
        str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
    )


# --- settings ------------------------------------------------------------------------------------

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_UINT_RE = re.compile(r"[0-9]+")
_URI_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ContractError(
        f"{name}: expected true/false/1/0/yes/no, got {describe(raw)}",
        field=name,
    )


def _parse_uint(name: str, raw: str) -> int:
    value = raw.strip()
    # int64 bound: the webhook and the Kubernetes API treat these as int64.
    if not _UINT_RE.fullmatch(value) or len(value) > 19 or int(value) > 2**63 - 1:
        raise ContractError(
            f"{name}: expected a non-negative integer, got {describe(raw)}", field=name
        )
    return int(value)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ContractError(
            f"{name}: must be an integer >= {minimum}, got {describe(value)}", field=name
        )


def _check_path(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ContractError(f"{name}: expected a non-empty path, got {describe(value)}", field=name)


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """Everything the runtime reads from its environment, parsed and validated.

    Construct it with `from_env()`; direct construction is validated too (range and type rules live
    in `__post_init__`, so there is one place for them). `to_env()` is the inverse of `from_env()`.
    """

    progress_file: str = DEFAULT_PROGRESS_FILE
    checkpoint_enabled: bool = DEFAULT_CHECKPOINT_ENABLED
    checkpoint_uri: str | None = None
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL  # seconds
    checkpoint_strategy: str = DEFAULT_CHECKPOINT_STRATEGY
    checkpoint_save_steps: int | None = None
    max_checkpoints: int = DEFAULT_MAX_CHECKPOINTS
    resume: bool = DEFAULT_RESUME
    jit: bool = DEFAULT_JIT
    local_dir: str | None = None  # None: the ramdisk tier is off
    local_period: int = DEFAULT_LOCAL_PERIOD
    control_dir: str = DEFAULT_CONTROL_DIR
    progress_update_frequency: int = DEFAULT_PROGRESS_UPDATE_FREQUENCY
    elastic_shutdown_timeout: int | None = None  # seconds; torchrun's own default when None
    job_kind: str | None = None
    job_name: str | None = None
    namespace: str | None = None
    on_unverifiable: str = DEFAULT_ON_UNVERIFIABLE

    def __post_init__(self) -> None:
        _check_path(TRAINING_PROGRESS_FILE, self.progress_file, optional=False)
        if not isinstance(self.checkpoint_enabled, bool):
            raise ContractError(
                f"{CHECKPOINT_ENABLED}: expected a bool, got {describe(self.checkpoint_enabled)}",
                field=CHECKPOINT_ENABLED,
            )
        self._check_uri()
        interval = self.checkpoint_interval
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise ContractError(
                f"{CHECKPOINT_INTERVAL}: must be a positive duration, got {describe(interval)}",
                field=CHECKPOINT_INTERVAL,
            )
        if self.checkpoint_strategy not in STRATEGIES:
            raise ContractError(
                f"{CHECKPOINT_STRATEGY}: must be one of {', '.join(STRATEGIES)}, "
                f"got {describe(self.checkpoint_strategy)}",
                field=CHECKPOINT_STRATEGY,
            )
        if self.checkpoint_save_steps is not None:
            _check_int(CHECKPOINT_SAVE_STEPS, self.checkpoint_save_steps, 1)
        # Retention never deletes the newest complete checkpoint, so fewer than 1 makes no sense.
        _check_int(CHECKPOINT_MAX_CHECKPOINTS, self.max_checkpoints, 1)
        for name, flag in ((CHECKPOINT_RESUME, self.resume), (CHECKPOINT_JIT, self.jit)):
            if not isinstance(flag, bool):
                raise ContractError(f"{name}: expected a bool, got {describe(flag)}", field=name)
        _check_path(CHECKPOINT_LOCAL_DIR, self.local_dir, optional=True)
        _check_int(CHECKPOINT_LOCAL_PERIOD, self.local_period, 1)
        _check_path(CHECKPOINT_CONTROL_DIR, self.control_dir, optional=False)
        _check_int(PROGRESS_UPDATE_FREQUENCY, self.progress_update_frequency, 1)
        if self.elastic_shutdown_timeout is not None:
            # torchrun reads it with int(); 0 is legal there (kill at once), so allow it.
            _check_int(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, self.elastic_shutdown_timeout, 0)
        for name, text in (
            (KUBECKPT_JOB_KIND, self.job_kind),
            (KUBECKPT_JOB_NAME, self.job_name),
            (KUBECKPT_NAMESPACE, self.namespace),
        ):
            if text is not None and (not isinstance(text, str) or not text):
                raise ContractError(
                    f"{name}: expected a non-empty string, got {describe(text)}", field=name
                )
        if self.on_unverifiable not in ON_UNVERIFIABLE_VALUES:
            raise ContractError(
                f"{CHECKPOINT_ON_UNVERIFIABLE}: must be one of "
                f"{', '.join(ON_UNVERIFIABLE_VALUES)}, got {describe(self.on_unverifiable)}",
                field=CHECKPOINT_ON_UNVERIFIABLE,
            )
        # Cross-field rules only matter when checkpointing is on; a disabled pod must still start.
        if self.checkpoint_enabled:
            if self.checkpoint_uri is None:
                raise ContractError(
                    f"{CHECKPOINT_URI}: required when {CHECKPOINT_ENABLED} is true",
                    field=CHECKPOINT_URI,
                )
            if self.checkpoint_strategy == "steps" and self.checkpoint_save_steps is None:
                raise ContractError(
                    f"{CHECKPOINT_SAVE_STEPS}: required when {CHECKPOINT_STRATEGY} is steps",
                    field=CHECKPOINT_SAVE_STEPS,
                )

    def _check_uri(self) -> None:
        uri = self.checkpoint_uri
        if uri is None:
            return
        _check_path(CHECKPOINT_URI, uri, optional=False)
        m = _URI_SCHEME_RE.match(uri)
        if m and m.group(1).lower() == "pvc":
            # The webhook mounts the claim and passes the mount path; the runtime cannot open pvc://.
            raise ContractError(
                f"{CHECKPOINT_URI}: pvc:// is a policy URI, the pod needs the mount path, "
                f"got {describe(uri)}",
                field=CHECKPOINT_URI,
            )
        if "://" in uri and not m:
            raise ContractError(
                f"{CHECKPOINT_URI}: invalid URI scheme in {describe(uri)}", field=CHECKPOINT_URI
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeSettings:
        """Parse the variables from `environ` (default os.environ); unset or empty means default."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            raw = env.get(name)
            # Kubernetes users often write `value: ""` to mean "not set".
            return raw if raw is not None and raw.strip() else None

        kwargs: dict[str, object] = {}
        for name, attr in _STRING_VARS:
            raw = get(name)
            if raw is not None:
                kwargs[attr] = raw
        for name, attr in _BOOL_VARS:
            raw = get(name)
            if raw is not None:
                kwargs[attr] = _parse_bool(name, raw)
        for name, attr in _INT_VARS:
            raw = get(name)
            if raw is not None:
                kwargs[attr] = _parse_uint(name, raw)
        raw = get(CHECKPOINT_INTERVAL)
        if raw is not None:
            try:
                interval = _parse_seconds(raw.strip())
                if interval <= 0:
                    raise ContractError("not positive")
                kwargs["checkpoint_interval"] = interval
            except ContractError:
                raise ContractError(
                    f"{CHECKPOINT_INTERVAL}: expected positive seconds or a Go duration like 5m, "
                    f"got {describe(raw)}",
                    field=CHECKPOINT_INTERVAL,
                ) from None
        raw = get(CHECKPOINT_STRATEGY)
        if raw is not None:
            kwargs["checkpoint_strategy"] = raw.strip().lower()
        raw = get(CHECKPOINT_ON_UNVERIFIABLE)
        if raw is not None:
            kwargs["on_unverifiable"] = raw.strip()
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The variables that reproduce these settings; None values are left out (unset)."""
        env: dict[str, str] = {}
        for name, attr in _STRING_VARS:
            value = getattr(self, attr)
            if value is not None:
                env[name] = value
        for name, attr in _BOOL_VARS:
            env[name] = "true" if getattr(self, attr) else "false"
        for name, attr in _INT_VARS:
            value = getattr(self, attr)
            if value is not None:
                env[name] = str(value)
        env[CHECKPOINT_INTERVAL] = _format_seconds(self.checkpoint_interval)
        env[CHECKPOINT_STRATEGY] = self.checkpoint_strategy
        if self.on_unverifiable != DEFAULT_ON_UNVERIFIABLE:  # an extension: only when set
            env[CHECKPOINT_ON_UNVERIFIABLE] = self.on_unverifiable
        return env

    @property
    def request_file(self) -> Path:
        """Written by preStop to ask for a checkpoint."""
        return Path(self.control_dir) / REQUEST_FILE

    @property
    def done_file(self) -> Path:
        """Written by the runtime once the requested checkpoint is saved."""
        return Path(self.control_dir) / DONE_FILE

    @property
    def failed_file(self) -> Path:
        """Written by the runtime when the requested checkpoint could not be saved."""
        return Path(self.control_dir) / FAILED_FILE


# (variable, attribute) tables shared by from_env and to_env so the two cannot disagree.
_STRING_VARS: Final = (
    (TRAINING_PROGRESS_FILE, "progress_file"),
    (CHECKPOINT_URI, "checkpoint_uri"),
    (CHECKPOINT_LOCAL_DIR, "local_dir"),
    (CHECKPOINT_CONTROL_DIR, "control_dir"),
    (KUBECKPT_JOB_KIND, "job_kind"),
    (KUBECKPT_JOB_NAME, "job_name"),
    (KUBECKPT_NAMESPACE, "namespace"),
)
_BOOL_VARS: Final = (
    (CHECKPOINT_ENABLED, "checkpoint_enabled"),
    (CHECKPOINT_RESUME, "resume"),
    (CHECKPOINT_JIT, "jit"),
)
_INT_VARS: Final = (
    (CHECKPOINT_SAVE_STEPS, "checkpoint_save_steps"),
    (CHECKPOINT_MAX_CHECKPOINTS, "max_checkpoints"),
    (CHECKPOINT_LOCAL_PERIOD, "local_period"),
    (PROGRESS_UPDATE_FREQUENCY, "progress_update_frequency"),
    (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "elastic_shutdown_timeout"),
)
