"""A loopback TCP proxy that a test can break: `blackhole()` silently drops every byte in both
directions (a network partition: nothing errors, nothing arrives), `heal()` resets the connections
that lived through it, `stop()`/`start()` refuse connections altogether."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self.blackholed = False
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Refuse new connections and reset the open ones."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._reset_all()

    def blackhole(self) -> None:
        self.blackholed = True

    def heal(self) -> None:
        self.blackholed = False
        self._reset_all()  # their TLS streams lost bytes: like a partition's aftermath

    def _reset_all(self) -> None:
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._conns.add(cw)
        try:
            while self.blackholed:  # a partition: the connection goes nowhere
                if await cr.read(65536) == b"":
                    return
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.transport.abort()
            return
        self._conns.add(uw)
        pipes = [
            asyncio.create_task(self._pipe(cr, uw)),
            asyncio.create_task(self._pipe(ur, cw)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in pipes:
                t.cancel()
            for w in (cw, uw):
                self._conns.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._tasks.difference_update(pipes)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            if self.blackholed:
                continue  # dropped on the floor, silently
            writer.write(data)
            await writer.drain()
