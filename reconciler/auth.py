"""Bearer-token sources. A projected service-account token is rotated by the kubelet (by swapping a
symlink), so `FileToken` re-reads the file whenever it changed; the client also re-reads it after
a 401 before giving up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol


class TokenSource(Protocol):
    def token(self) -> str | None:
        """The current token, without the "Bearer " prefix."""
        ...

    def invalidate(self) -> None:
        """The server rejected the last token: fetch a fresh one next time."""
        ...


class StaticToken:
    def __init__(self, token: str) -> None:
        self._token = token

    def token(self) -> str | None:
        return self._token

    def invalidate(self) -> None:
        pass


class FileToken:
    """A token read from a file, re-read when its inode, size or mtime changes (a `stat` per
    request, which costs microseconds; client-go instead re-reads once a minute)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._sig: tuple[int, int, int] | None = None
        self._token: str | None = None

    def token(self) -> str | None:
        try:
            st = self.path.stat()  # follows the ..data symlink that the kubelet swaps
        except FileNotFoundError:
            return self._token
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig != self._sig:
            self._token = self.path.read_text().strip() or None
            self._sig = sig
        return self._token

    def invalidate(self) -> None:
        self._sig = None


class KubeconfigToken:
    """A token from a kubeconfig user (static, or from an exec/auth-provider plugin that the
    `kubernetes` package refreshes when it expires)."""

    def __init__(self, configuration: Any) -> None:
        self._cfg = configuration

    def token(self) -> str | None:
        hook = getattr(self._cfg, "refresh_api_key_hook", None)
        if hook is not None:
            hook(self._cfg)  # cheap unless the token has expired
        value = self._cfg.api_key.get("BearerToken") or self._cfg.api_key.get("authorization")
        if not value:
            return None
        return value.removeprefix("Bearer ").strip()

    def invalidate(self) -> None:
        pass
