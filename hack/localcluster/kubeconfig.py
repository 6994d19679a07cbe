"""The kubeconfig files of the local cluster (admin, kubelet, components): client certificates."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, crt: Path, key: Path) -> None:
    """A kubeconfig for `server` (CA file `ca`) as `user` with its certificate; mode 0600."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeckpt-local",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": user, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [
            {"name": "kubeckpt-local", "context": {"cluster": "kubeckpt-local", "user": user}}
        ],
        "current-context": "kubeckpt-local",
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
