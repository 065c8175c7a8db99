"""A TCP forwarder on 127.0.0.1 that can cut a connection in the middle, for tests of dropped
SSH connections against the real sshd (the bytes are the real, encrypted SSH stream).

    with TcpProxy(2222) as proxy:          # proxy.port forwards to 127.0.0.1:2222
        proxy.cut_first(n_bytes)           # the next connection dies after n server->client bytes
        ...
        proxy.connections, proxy.cuts, proxy.server_bytes
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._cut_plan: list[int] = []  # for each next connection: cut after this many server bytes
        self.connections = 0
        self.cuts = 0
        self.server_bytes: list[int] = []  # per connection, server -> client bytes forwarded
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "TcpProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        try:
            self._listener.close()
        except OSError:
            pass

    def cut_first(self, n_bytes: int) -> None:
        """The next connection is reset after `n_bytes` bytes went from the server to the client."""
        with self._lock:
            self._cut_plan.append(n_bytes)

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                index = self.connections
                self.connections += 1
                self.server_bytes.append(0)
                cut = self._cut_plan.pop(0) if self._cut_plan else None
            server = socket.create_connection(self.target, timeout=10)
            server.settimeout(None)
            threading.Thread(target=self._pump, args=(client, server, None, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, index, cut), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, index: int | None, cut: int | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if index is not None:
                    with self._lock:
                        sent = self.server_bytes[index]
                    if cut is not None and sent + len(data) >= cut:
                        dst.sendall(data[: max(0, cut - sent)])
                        with self._lock:
                            self.server_bytes[index] = cut
                            self.cuts += 1
                        # a reset, as when a VPN or NAT drops the connection: both sides see it die.
                        # SHUT_RD first wakes the other direction's thread, blocked in recv() on the
                        # same socket: until that call returns it holds the socket open, and the
                        # reset would wait for the client's next keepalive (30 s).
                        for s in (src, dst):
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                            try:
                                s.shutdown(socket.SHUT_RD)
                            except OSError:
                                pass
                            s.close()
                        return
                    with self._lock:
                        self.server_bytes[index] += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
