"""The chaos harness's FaultProxy over real loopback sockets: it forwards byte for byte,
passes a close on, and ``drop`` resets the open connections and refuses new ones for its
window, then lets them through again."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from harness.faultproxy import FaultProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _talk(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_it_forwards_then_drops_then_forwards_again(echo: int) -> None:
    proxy = FaultProxy("127.0.0.1", echo)
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB: the end arrives whole after the FIN
        assert _talk(proxy.port, payload) == payload

        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        proxy.drop(1.0)
        with pytest.raises(OSError):  # reset (or ended) under the client's feet
            held.sendall(b"again")
            if not held.recv(4):
                raise ConnectionResetError("closed")
        held.close()
        with pytest.raises(OSError):
            _talk(proxy.port, b"refused")  # a new one within the window is reset too
        assert proxy.dropped >= 3

        time.sleep(1.1)
        assert _talk(proxy.port, b"back") == b"back"
    finally:
        proxy.close()
