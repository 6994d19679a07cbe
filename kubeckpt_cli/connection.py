"""Which cluster and namespace, as kubectl decides them, and a client tuned for a person waiting.

Order, as kubectl: `--kubeconfig`, else $KUBECONFIG (its files merged), else ~/.kube/config, else
the pod's service account (in-cluster). The namespace: `-n`, else the context's, else "default".
The client gives up sooner than the controller's: one retry, a 5 s connect timeout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kubeckpt_api import __version__
from reconciler.client import Client
from reconciler.config import (
    SERVICE_ACCOUNT_DIR,
    ClientConfig,
    kubeconfig_files,
    load_incluster,
    load_kubeconfig,
)

from .errors import CliError

USER_AGENT = f"kubeckpt-cli/{__version__}"


@dataclass
class Target:
    config: ClientConfig
    namespace: str  # the namespace to use when none is given on the command line
    source: str  # where the configuration came from, for messages

    @property
    def server(self) -> str:
        return self.config.server


def _kubeconfig_files(explicit: str | None) -> list[Path]:
    """--kubeconfig (one file), else every file of $KUBECONFIG that exists (merged, as kubectl
    merges them), else ~/.kube/config if it exists; [] when there is none."""
    files = kubeconfig_files(explicit)
    if explicit or any(os.environ.get("KUBECONFIG", "").split(os.pathsep)):
        return files
    return files if files[0].exists() else []  # ~/.kube/config, when there is one


def resolve(kubeconfig: str | None, context: str | None) -> Target:
    """Load the configuration; CliError (one line) when there is none or it is unusable."""
    files = _kubeconfig_files(kubeconfig)
    if not files:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
            if context:
                raise CliError(f"--context {context}: there is no kubeconfig to take it from")
            cfg = load_incluster()
            return _tuned(Target(cfg, cfg.namespace, "in-cluster service account"))
        raise CliError(
            "no kubeconfig: set KUBECONFIG or pass --kubeconfig (~/.kube/config does not exist "
            "and this is not a pod)"
        )
    where = os.pathsep.join(str(f) for f in files)
    if not all(f.is_file() for f in files):
        raise CliError(f"kubeconfig {where} does not exist: fix --kubeconfig or KUBECONFIG")
    try:
        cfg = load_kubeconfig(where, context)
    except Exception as e:  # the kubernetes loader's ConfigException, YAML, a bad exec plugin
        text = " ".join(str(e).split()) or type(e).__name__
        raise CliError(f"cannot use kubeconfig {where}: {text[:200]}") from None
    return _tuned(Target(cfg, cfg.namespace, where))


def _tuned(target: Target) -> Target:
    cfg = target.config
    cfg.qps = None
    cfg.max_retries = 1
    cfg.connect_timeout = 5.0
    cfg.timeout = 15.0
    cfg.max_retry_wait = 2.0
    cfg.user_agent = USER_AGENT
    return target


def client_for(target: Target) -> Client:
    return Client(target.config)
