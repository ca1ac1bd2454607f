"""A TCP proxy that drops connections on demand, for the chaos harness (``harness.chaos``).

``FaultProxy(target_host, target_port)`` listens on a free loopback port and forwards each
connection to the target, byte for byte (HTTP/1.1, gRPC over HTTP/2 alike). ``drop(s)``
resets every open connection and, for ``s`` seconds, resets each new one as soon as it is
accepted: what a client sees when a network path fails, as opposed to a stalled server
(SIGSTOP), whose connections stay open and silent. No toxiproxy here (its server is a Go
binary this machine does not have); this is the one fault the harness needs of it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._refuse_until = 0.0
        self._closed = False
        self.dropped = 0  # sockets reset by drop(): open ones and new ones refused
        threading.Thread(target=self._accept, name=f"fault-proxy-{self.port}", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def drop(self, seconds: float) -> None:
        """Reset every open connection, and each new one for ``seconds``."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
            victims = list(self._open)
        for sock in victims:
            self._reset(sock)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            victims = list(self._open)
        for sock in victims:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            pair = [2]  # pumps still running; the last one closes both sockets
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink, pair, client, upstream),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, pair: list[int],
              *both: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)  # pass the end on (a FIN), the other way may go on
        except OSError:
            pass
        with self._lock:
            pair[0] -= 1
            last = pair[0] == 0
            if last:
                self._open.difference_update(both)
        if last:
            for sock in both:
                with contextlib.suppress(OSError):
                    sock.close()

    def _reset(self, sock: socket.socket) -> None:
        """Close with RST (SO_LINGER 0), as a failed path looks to the peer."""
        with self._lock:
            self._open.discard(sock)
            self.dropped += 1
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()
