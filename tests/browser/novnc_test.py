#!/usr/bin/env python3
"""noVNC in a real browser against hakoniwa's VNC server, over WebSocket.

The server is the display crate's own RFB/WebSocket server over a test
picture (crates/display/examples/vnc_test_pattern.rs; no VM needed). The
client is noVNC's RFB library (the npm package @novnc/novnc) in headless
Chromium, driven through the DevTools protocol. Checked:

  1. noVNC connects over WebSocket and shows the picture pixel for pixel
     (sample points in every quadrant and along the gradient);
  2. a rectangle painted on the server reaches the browser (an update after
     the first), and a moved one too (CopyRect);
  3. a key typed and a click in the browser reach the server as the right
     keysym and the right framebuffer coordinates;
  4. with a password, noVNC authenticates (VNC authentication) and a wrong
     password is refused.

Usage: novnc_test.py --server BIN --novnc DIR --chromium BIN
(DIR holds the npm package's lib/). tests/browser/run prepares all three.
"""

import argparse
import http.server
import json
import os
import queue
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import websocket  # websocket-client, from build/pyenv

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, HEIGHT = 640, 480


def pattern_pixel(x, y, width=WIDTH, height=HEIGHT):
    """The server's test picture (vnc_test_pattern.rs: pattern_pixel)."""
    band = height // 8
    mid = height // 2
    if mid - band // 2 <= y < mid + band // 2:
        level = x * 255 // max(width - 1, 1)
        return (level << 16) | (level << 8) | level
    if y < mid:
        return 0xFF0000 if x < width // 2 else 0x00FF00
    return 0x0000FF if x < width // 2 else 0xFFFFFF


class Failure(Exception):
    pass


def wait_until(what, probe, timeout=30.0, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise Failure(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


class PatternServer:
    """vnc_test_pattern as a child process: commands in, lines out."""

    def __init__(self, binary, origin, password=None):
        # origin: the page's (noVNC is served from another port), which
        # the server's WebSocket Origin check must be told about.
        args = [binary, "--width", str(WIDTH), "--height", str(HEIGHT), "--origin", origin]
        if password:
            args += ["--password", password]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.next_line(15)
        if not first.startswith("listening "):
            raise Failure(f"vnc_test_pattern said {first!r}")
        fields = dict(f.split("=", 1) for f in first.split()[1:])
        self.websocket = fields["websocket"]

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout=10.0):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise Failure("vnc_test_pattern printed nothing") from None
        if line is None:
            raise Failure(f"vnc_test_pattern exited ({self.proc.wait()})")
        return line

    def command(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.next_line()
            if line == "ok" or line.startswith("stats "):
                return line
            if line.startswith("error "):
                raise Failure(f"{text!r}: {line}")
            # Input events printed meanwhile are not what we wait for here.

    def expect_input(self, wanted, timeout=10.0):
        """Waits for the input line `wanted`; returns the lines seen."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                raise Failure("vnc_test_pattern exited")
            seen.append(line)
            if line == wanted:
                return seen
        raise Failure(f"the server never got {wanted!r}; it got {seen}")

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class StaticFiles:
    """novnc.html and noVNC's lib/ over HTTP on localhost."""

    def __init__(self, novnc_dir):
        self.root = tempfile.mkdtemp(prefix="hk-novnc-www.")
        shutil.copy(os.path.join(HERE, "novnc.html"), self.root)
        os.symlink(os.path.join(os.path.abspath(novnc_dir), "lib"), os.path.join(self.root, "lib"))
        root = self.root

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=root, **kwargs)

            def log_message(self, *args):
                pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.httpd = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="hk-novnc-chromium.")
        # The flags keep Chromium off the network (this machine has none but
        # the package registries) and out of a sandbox root cannot use.
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-extensions", "--window-size=800,600",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        wait_until("Chromium's DevTools port", lambda: self._alive() and os.path.exists(port_file)
                   and open(port_file).read().split("\n")[0], timeout=60)
        port = open(port_file).read().split("\n")[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0

    def _alive(self):
        if self.proc.poll() is not None:
            raise Failure(f"Chromium exited ({self.proc.returncode}): {self.proc.stderr.read()[-2000:]}")
        return True

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise Failure(f"{method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise Failure(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        try:
            self.ws.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


SAMPLES = [(10, 10), (WIDTH - 11, 10), (10, HEIGHT - 11), (WIDTH - 11, HEIGHT - 11),
           (WIDTH // 4, HEIGHT // 4), (3 * WIDTH // 4, 3 * HEIGHT // 4),
           (0, HEIGHT // 2), (WIDTH // 3, HEIGHT // 2), (WIDTH - 1, HEIGHT // 2),
           (WIDTH // 2 - 1, HEIGHT // 2 - HEIGHT // 16 - 1), (WIDTH // 2, HEIGHT // 2 + HEIGHT // 16)]


def screen_matches(browser, expected):
    """Returns True if every (x, y) -> colour in `expected` is on noVNC's canvas."""
    got = browser.eval("JSON.stringify(%s.map(p => window.hk.pixel(p[0], p[1])))"
                       % json.dumps([[x, y] for (x, y) in expected]))
    got = json.loads(got)
    return all(g == expected[p] for g, p in zip(got, expected))


def open_page(browser, files, server, password=None):
    url = f"http://127.0.0.1:{files.port}/novnc.html?ws=ws://{server.websocket}"
    if password is not None:
        url += f"&password={password}"
    browser.call("Page.navigate", url=url)
    wait_until("the page to load", lambda: browser.eval("window.hk && window.hk.state") not in (None, "loading"))


def connected(browser):
    state = browser.eval("window.hk.state")
    if state in ("failed", "disconnected", "error"):
        raise Failure(f"noVNC: {state}: {browser.eval('JSON.stringify(window.hk)')}")
    return state == "connected"


def check_picture_input_and_updates(browser, files, binary):
    server = PatternServer(binary, files.origin)
    try:
        open_page(browser, files, server)
        wait_until("noVNC to connect over WebSocket", lambda: connected(browser))
        canvas = wait_until("noVNC's canvas", lambda: browser.eval("window.hk.canvas()"))
        if (canvas["width"], canvas["height"]) != (WIDTH, HEIGHT):
            raise Failure(f"noVNC's canvas is {canvas}, the screen {WIDTH}x{HEIGHT}")
        expected = {p: pattern_pixel(*p) for p in SAMPLES}
        wait_until("the test picture in the browser", lambda: screen_matches(browser, expected), timeout=20)
        print(f"novnc: connected over WebSocket; {len(expected)} sample pixels match the picture")

        # An update after the first one: a magenta rectangle.
        server.command("fill 100 60 50 40 ff00ff")
        painted = {(100, 60): 0xFF00FF, (149, 99): 0xFF00FF, (150, 100): pattern_pixel(150, 100),
                   (99, 59): pattern_pixel(99, 59)}
        wait_until("the painted rectangle", lambda: screen_matches(browser, painted), timeout=20)
        # A move: the rectangle's copy lands 200 pixels to the right.
        server.command("move 100 60 50 40 300 300")
        moved = {(300, 300): 0xFF00FF, (349, 339): 0xFF00FF, (350, 340): pattern_pixel(350, 340)}
        wait_until("the moved rectangle", lambda: screen_matches(browser, moved), timeout=20)
        stats = json.loads(server.command("stats")[len("stats "):])
        print(f"novnc: updates reached the browser (server counters: {stats})")
        if stats["rects_zrle"] == 0 or stats["rects_copyrect"] == 0:
            raise Failure(f"noVNC asks for ZRLE and CopyRect, yet the server sent {stats}")

        # Input: a key and a click.
        browser.eval("window.rfb.focus()")
        browser.call("Input.dispatchKeyEvent", type="keyDown", key="a", code="KeyA",
                     text="a", windowsVirtualKeyCode=65, nativeVirtualKeyCode=65)
        browser.call("Input.dispatchKeyEvent", type="keyUp", key="a", code="KeyA",
                     windowsVirtualKeyCode=65, nativeVirtualKeyCode=65)
        server.expect_input("key 0x61 1")
        server.expect_input("key 0x61 0")
        x, y = 123, 234
        at = {"x": canvas["left"] + x + 0.5, "y": canvas["top"] + y + 0.5}
        browser.call("Input.dispatchMouseEvent", type="mouseMoved", **at)
        browser.call("Input.dispatchMouseEvent", type="mousePressed", button="left", clickCount=1, **at)
        browser.call("Input.dispatchMouseEvent", type="mouseReleased", button="left", clickCount=1, **at)
        server.expect_input(f"pointer {x} {y} 1")
        server.expect_input(f"pointer {x} {y} 0")
        print("novnc: a key (keysym 0x61) and a click at (123, 234) reached the server")
    finally:
        server.close()


def check_authentication(browser, files, binary):
    server = PatternServer(binary, files.origin, password="hk-pass")
    try:
        open_page(browser, files, server, password="hk-pass")
        wait_until("noVNC to authenticate", lambda: connected(browser))
        expected = {p: pattern_pixel(*p) for p in SAMPLES[:4]}
        wait_until("the picture after authentication", lambda: screen_matches(browser, expected), timeout=20)
        events = browser.eval("window.hk.events")
        if "credentialsrequired" not in events:
            raise Failure(f"noVNC was never asked for a password: {events}")

        open_page(browser, files, server, password="wrong")
        wait_until("the wrong password to be refused",
                   lambda: browser.eval("window.hk.state") in ("failed", "disconnected"))
        events = browser.eval("window.hk.events")
        if not any(e.startswith("securityfailure") for e in events):
            raise Failure(f"a wrong password was not refused as a security failure: {events}")
        stats = json.loads(server.command("stats")[len("stats "):])
        if stats["clients_refused"] < 1:
            raise Failure(f"the server did not count the refused client: {stats}")
        print("novnc: VNC authentication: the right password connects, a wrong one is refused")
    finally:
        server.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="the vnc_test_pattern binary")
    parser.add_argument("--novnc", required=True, help="the @novnc/novnc package directory")
    parser.add_argument("--chromium", default="chromium")
    args = parser.parse_args()

    files = StaticFiles(args.novnc)
    browser = None
    try:
        browser = Browser(args.chromium)
        check_picture_input_and_updates(browser, files, args.server)
        check_authentication(browser, files, args.server)
    except Failure as e:
        print(f"novnc: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if browser:
            browser.close()
        files.close()
    print("novnc: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
