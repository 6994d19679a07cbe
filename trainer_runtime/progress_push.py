"""Rank 0 pushes each progress record to the kubeckpt reconciler (issue 26), when the webhook
injected the endpoint (CheckpointPolicy progress.push): KUBECKPT_PROGRESS_PUSH_URL, the projected
token's path (KUBECKPT_PROGRESS_PUSH_TOKEN) and the CA's (KUBECKPT_PROGRESS_PUSH_CA).

Never in the training loop's way: `offer` only swaps the newest record into a slot and wakes a
daemon thread, which POSTs it (5 s timeout). Records offered while a POST is in flight collapse
into the newest; a failed POST is dropped, not retried (the next record follows, and the
reconciler's exec read is the fallback: it reads the file when pushes stop). The file and the
termination message are written as before, whatever happens here.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import urllib.request
from pathlib import Path

from .contract.env import (
    KUBECKPT_PROGRESS_PUSH_CA,
    KUBECKPT_PROGRESS_PUSH_TOKEN,
    KUBECKPT_PROGRESS_PUSH_URL,
)

log = logging.getLogger(__name__)

TIMEOUT = 5.0


class ProgressPusher:
    def __init__(self, url: str, token_path: str | None, ca_path: str | None) -> None:
        self.url = url
        self.token_path = token_path
        self.ca_path = ca_path
        self._slot: bytes | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.sent = 0
        self.failed = 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ProgressPusher | None:
        e = os.environ if env is None else env
        url = e.get(KUBECKPT_PROGRESS_PUSH_URL)
        if not url:
            return None
        return cls(url, e.get(KUBECKPT_PROGRESS_PUSH_TOKEN), e.get(KUBECKPT_PROGRESS_PUSH_CA))

    def offer(self, body: bytes) -> None:
        """Push `body` soon, in the background; returns at once."""
        with self._lock:
            self._slot = body
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kubeckpt-progress-push", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                body, self._slot = self._slot, None
            if body is not None:
                self._send(body)

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        # Read each time: the CA ConfigMap may appear or change while the job runs.
        if self.ca_path and Path(self.ca_path).is_file():
            return ssl.create_default_context(cafile=self.ca_path)
        return ssl.create_default_context()

    def _send(self, body: bytes) -> None:
        try:
            headers = {"Content-Type": "application/json"}
            if self.token_path:  # the kubelet rotates the projected token: read it each time
                token = Path(self.token_path).read_text().strip()
                headers["Authorization"] = f"Bearer {token}"
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self._context()) as resp:
                resp.read(1024)
            self.sent += 1
        except Exception as e:  # a failed push must never reach training
            self.failed += 1
            if not self._warned:
                log.warning("kubeckpt: progress push to %s failed (dropped): %s", self.url, e)
                self._warned = True
