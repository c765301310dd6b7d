#!/usr/bin/env python3
"""A real VNC client (vncdotool) driven from the display tests and benchmark.

    vnc_client.py capture HOST:PORT OUT.png [--password P] [--encoding raw|zrle]
    vnc_client.py key HOST:PORT KEY...          e.g. key 127.0.0.1:5900 a shift-b
    vnc_client.py move HOST:PORT X Y [--click]
    vnc_client.py check PNG X Y W H RRGGBB      every pixel of the rectangle has the colour
    vnc_client.py same PNG PNG [X Y W H]        two captures are identical (in the rectangle)
    vnc_client.py matches-raw PNG RAW W H        a capture equals a linear XRGB dump (hk-fbdraw -F)

Exit status 0 on success; 1 with one line on stderr otherwise. Runs with the
project's venv (scripts/lib/pyenv.sh), where vncdotool and Pillow live.
"""
import argparse
import sys

from PIL import Image


def connect(server, password, encoding="raw"):
    from vncdotool import api, client, rfb

    class Client(client.VNCDoToolClient):
        pass

    Client.encoding = {"raw": rfb.Encoding.RAW, "zrle": rfb.Encoding.ZRLE}[encoding]

    class Factory(client.VNCDoToolFactory):
        protocol = Client

    host, port = server.rsplit(":", 1)
    # vncdotool takes HOST::PORT for a TCP port (HOST:N is display N).
    return api, api.connect(f"{host}::{port}", password=password, factory_class=Factory, timeout=60)


def run_client(args, action):
    api, c = connect(args.server, args.password, getattr(args, "encoding", "raw"))
    try:
        action(c)
    finally:
        try:
            c.disconnect()
        finally:
            api.shutdown()


def region(img, rect):
    if rect is None:
        return img
    x, y, w, h = rect
    return img.crop((x, y, x + w, y + h))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("capture", "key", "move"):
        s = sub.add_parser(name)
        s.add_argument("server")
        s.add_argument("--password")
        if name == "capture":
            s.add_argument("out")
            s.add_argument("--encoding", choices=["raw", "zrle"], default="raw")
        elif name == "key":
            s.add_argument("keys", nargs="+")
        else:
            s.add_argument("x", type=int)
            s.add_argument("y", type=int)
            s.add_argument("--click", action="store_true")
    s = sub.add_parser("check")
    s.add_argument("png")
    s.add_argument("rect", nargs=4, type=int)
    s.add_argument("color")
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("rect", nargs="*", type=int)
    s = sub.add_parser("matches-raw")
    s.add_argument("png")
    s.add_argument("raw")
    s.add_argument("width", type=int)
    s.add_argument("height", type=int)
    args = p.parse_args()

    if args.cmd == "capture":
        run_client(args, lambda c: c.captureScreen(args.out))
    elif args.cmd == "key":
        def keys(c):
            for k in args.keys:
                c.keyPress(k)
        run_client(args, keys)
    elif args.cmd == "move":
        def move(c):
            c.mouseMove(args.x, args.y)
            if args.click:
                c.mousePress(1)
        run_client(args, move)
    elif args.cmd == "check":
        want = tuple(int(args.color[i:i + 2], 16) for i in (0, 2, 4))
        img = region(Image.open(args.png).convert("RGB"), args.rect)
        bad = [(x, y, px) for (i, px) in enumerate(img.getdata())
               for (x, y) in [(i % img.width, i // img.width)] if px != want]
        if bad:
            x, y, px = bad[0]
            sys.exit(f"{len(bad)} of {img.width * img.height} pixels differ from {want}; "
                     f"first at +{x},+{y}: {px}")
    elif args.cmd == "same":
        rect = args.rect if len(args.rect) == 4 else None
        a = region(Image.open(args.a).convert("RGB"), rect)
        b = region(Image.open(args.b).convert("RGB"), rect)
        if a.size != b.size:
            sys.exit(f"sizes differ: {a.size} vs {b.size}")
        diff = sum(1 for pa, pb in zip(a.getdata(), b.getdata()) if pa != pb)
        if diff:
            sys.exit(f"{diff} of {a.width * a.height} pixels differ")
    elif args.cmd == "matches-raw":
        with open(args.raw, "rb") as f:
            data = f.read(args.width * args.height * 4)
        want = Image.frombytes("RGB", (args.width, args.height), data, "raw", "BGRX")
        got = Image.open(args.png).convert("RGB")
        if got.size != want.size:
            sys.exit(f"sizes differ: {got.size} vs {want.size}")
        bad = [i for i, (pa, pb) in enumerate(zip(got.getdata(), want.getdata())) if pa != pb]
        if bad:
            i = bad[0]
            sys.exit(f"{len(bad)} pixels differ from the expected picture; first at "
                     f"{i % args.width},{i // args.width}: got {got.getpixel((i % args.width, i // args.width))}, "
                     f"want {want.getpixel((i % args.width, i // args.width))}")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # one line, no traceback, for the test's message
        sys.exit(f"vnc_client: {type(e).__name__}: {e}")
