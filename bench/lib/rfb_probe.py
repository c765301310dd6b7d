"""A minimal RFB 3.8 client for the display benchmark: it keeps one
incremental FramebufferUpdateRequest outstanding and timestamps every update
the server sends, so the benchmark can see when a guest drawing reached a
client. Raw encoding only (the cheapest to decode, so the client's own speed
does not shape the figures); security None. Standard library only.

The tests use a full client (vncdotool); this is only a stopwatch.
"""

import socket
import struct
import threading
import time


class RfbProbe:
    def __init__(self, host, port, timeout=30):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.lock = threading.Condition()
        self.updates = []  # (monotonic arrival time, rectangles, bytes)
        self.error = None
        self._handshake()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def _handshake(self):
        version = self._recv(12)
        if not version.startswith(b"RFB 003."):
            raise ConnectionError("not an RFB server: %r" % version)
        self.sock.sendall(b"RFB 003.008\n")
        (count,) = struct.unpack("!B", self._recv(1))
        types = self._recv(count)
        if 1 not in types:
            raise ConnectionError("server wants authentication (types %r)" % list(types))
        self.sock.sendall(b"\x01")
        (result,) = struct.unpack("!I", self._recv(4))
        if result != 0:
            raise ConnectionError("security handshake failed")
        self.sock.sendall(b"\x01")  # shared
        self.width, self.height = struct.unpack("!HH", self._recv(4))
        self._recv(16)  # pixel format: the server's 32 bpp
        (name_len,) = struct.unpack("!I", self._recv(4))
        self._recv(name_len)
        # SetEncodings: Raw only.
        self.sock.sendall(struct.pack("!BxHi", 2, 1, 0))
        self._request(incremental=False)
        self.sock.settimeout(None)

    def _request(self, incremental):
        self.sock.sendall(struct.pack("!BBHHHH", 3, 1 if incremental else 0, 0, 0,
                                      self.width, self.height))

    def _run(self):
        try:
            while True:
                (kind,) = struct.unpack("!B", self._recv(1))
                if kind != 0:
                    raise ConnectionError("unexpected server message %d" % kind)
                (nrects,) = struct.unpack("!xH", self._recv(3))
                size = 0
                for _ in range(nrects):
                    x, y, w, h, enc = struct.unpack("!HHHHi", self._recv(12))
                    if enc != 0:
                        raise ConnectionError("unexpected encoding %d" % enc)
                    size += w * h * 4
                    left = w * h * 4
                    while left:
                        chunk = self.sock.recv(min(left, 1 << 20))
                        if not chunk:
                            raise ConnectionError("server closed the connection")
                        left -= len(chunk)
                now = time.monotonic()
                self._request(incremental=True)
                with self.lock:
                    self.updates.append((now, nrects, size))
                    self.lock.notify_all()
        except (OSError, ConnectionError) as e:
            with self.lock:
                self.error = str(e)
                self.lock.notify_all()

    def count(self):
        with self.lock:
            return len(self.updates)

    def wait_update_after(self, t0, timeout):
        """The arrival time of the first update that arrived after t0."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for t, _, _ in self.updates:
                    if t > t0:
                        return t
                left = deadline - time.monotonic()
                if left <= 0 or self.error:
                    return None
                self.lock.wait(left)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
