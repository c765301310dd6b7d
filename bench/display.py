#!/usr/bin/env python3
"""Display benchmark (seed 000, Goto and Minematsu): reruns the paper's
experiments on hakoniwa's virtual display, in one rig run.

1. Table 2 — update detection time per hdbench pattern (rect, circle, text,
   scroll on a 640x480 canvas at 100,100), linear vs page-tiled framebuffer,
   with dirtylog. The paper's time runs from the timer to the end of
   compression and queueing for the client; ours is detect + compare per
   period plus the VNC encode per update. Also pages reported vs changed
   (the useful detection ratio).
2. Figures 11-12 and table 3 — a 480x400 "video" at 30 fps on the tiled
   framebuffer with dirtylog vs wp (and the compare baseline): detections
   per second (the paper's frame rate), CPU (whole L1 from /proc/stat, as
   the paper's management domain; and the VMM process), and KVM's
   statistics (exits, page faults) over the same window.
3. Beyond the paper — refresh=timer vs refresh=event: latency from the
   guest's drawing to a client's update after an idle stretch.

A client is connected throughout (bench/rfb_probe.py, Raw encoding) so
updates are really encoded and sent. The paper measures 10 s in the middle
of 20 s runs; so does this script (--seconds / --window to change).

Run: scripts/bench-display (which uses the rig where there is no hardware
KVM). Writes bench/results/display.{json,md,png}.
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hkguest import Console, PROMPT_RE, ctl  # noqa: E402
from rfb_probe import RfbProbe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = ["rect", "circle", "text", "scroll"]
METHODS = ["compare", "dirtylog", "wp"]
# Table 2's drawing is paced (hk-fbdraw -r) so that both layouts draw the
# same shapes per period: unpaced, the guest draws several times faster in
# the linear layout (its per-pixel offset is simpler) and each column would
# measure a different amount of drawing. Rates all guests here sustain in
# both layouts (unpaced, the rig's slowest was ~130 scrolls/s tiled).
DEFAULT_RATES = "rect=300,circle=300,text=300,scroll=30"
PAPER_TABLE2 = {  # ms, linear -> tiled, dirty bits (page-table lookup)
    "rect": (35.4, 32.1), "circle": (42.2, 40.2), "text": (48.8, 45.0), "scroll": (29.1, 26.0)}
PAPER_VIDEO = {  # 30 fps video, 480x400, tiled
    "fps": {"dirtylog": 28.0, "wp": 28.0},
    "cpu_percent": {"dirtylog": 6.5, "wp": 6.5},
    "exits": {"dirtylog": 173890, "wp": 462348},
    "shadow_page_faults": {"dirtylog": 32961, "wp": 318510},
}
DRAW_RE = re.compile(rb"hk-fbdraw: pattern=(\w+) layout=(\w+) ops=(\d+) seconds=([0-9.]+) "
                     rb"ops_per_s=([0-9.]+)")
VIDEO_RE = re.compile(rb"hk-video: frames=(\d+) seconds=([0-9.]+) fps=([0-9.]+)")
KVM_KEYS = ["exits", "pf_fixed", "pf_taken", "pf_guest", "pf_spurious", "io_exits",
            "mmio_exits", "halt_exits", "irq_exits", "nmi_window_exits", "pf_emulate",
            "pf_mmio_spte_created", "irq_injections"]


def system_cpu():
    """(busy, total) jiffies of the whole machine (L1), like the paper's
    management-domain /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def process_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Vm:
    """A hakoniwa guest with a display, a console and a connected probe."""

    def __init__(self, args, tmp, layout, dirty):
        self.args = args
        self.socket = os.path.join(tmp, "api-%s-%d.sock" % (layout, time.monotonic_ns()))
        argv = [args.hakoniwa, "run", "--cpus", "1", "--memory", "512M", "--api-socket",
                self.socket, "--display",
                "vnc=127.0.0.1:0,layout=%s,dirty=%s" % (layout, dirty)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.con = Console(self.proc)
        if not self.con.wait(PROMPT_RE, 0, args.timeout):
            raise RuntimeError("no prompt: " + self.con.tail())
        info = self.display()
        host, port = info["vnc_address"].rsplit(":", 1)
        self.probe = RfbProbe(host, int(port))

    def display(self, *change):
        if self.proc.poll() is not None:
            raise RuntimeError("hakoniwa exited with status %s; console: %s; stderr: %s" % (
                self.proc.returncode, self.con.tail(), self.proc.stderr.read().decode(
                    "utf-8", "replace")[-600:]))
        return ctl(self.args.hakoniwa, self.socket, "display", *change)

    def run(self, command, regex, seconds):
        """Starts COMMAND in the guest; returns (before, after, result match)
        with display metrics sampled over the middle window."""
        start = self.con.size()
        self.con.send(command + "\n")
        lead = (seconds - self.args.window) / 2
        time.sleep(lead)
        before = (self.display(), system_cpu(), process_cpu(self.proc.pid), time.monotonic(),
                  self.probe.count())
        time.sleep(self.args.window)
        after = (self.display(), system_cpu(), process_cpu(self.proc.pid), time.monotonic(),
                 self.probe.count())
        m = self.con.wait(regex, start, seconds + self.args.timeout)
        if not m:
            raise RuntimeError("%s: no result: %s" % (command, self.con.tail()))
        # The prompt back, so the next command starts clean.
        self.con.wait(PROMPT_RE, m.end(), 30)
        return before, after, m

    def close(self):
        self.probe.close()
        try:
            self.con.send("poweroff\n")
            self.proc.wait(30)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def window_figures(before, after):
    (m0, cpu0, p0, t0, u0), (m1, cpu1, p1, t1, u1) = before, after
    periods = m1["periods"] - m0["periods"]
    secs = t1 - t0
    det = (m1["detect_ms_total"] - m0["detect_ms_total"]) / max(periods, 1)
    cmp_ = (m1["compare_ms_total"] - m0["compare_ms_total"]) / max(periods, 1)
    v0, v1 = m0["vnc"], m1["vnc"]
    vnc_updates = v1["updates"] - v0["updates"]
    enc = (v1["encode_ns"] - v0["encode_ns"]) / 1e6 / max(vnc_updates, 1)
    send = (v1["send_ns"] - v0["send_ns"]) / 1e6 / max(vnc_updates, 1)
    reported = m1["pages_reported"] - m0["pages_reported"]
    changed = m1["pages_changed"] - m0["pages_changed"]
    kvm = {k: m1.get("kvm", {}).get(k, 0) - m0.get("kvm", {}).get(k, 0)
           for k in KVM_KEYS if k in m1.get("kvm", {})}
    return {
        "window_s": round(secs, 2),
        "periods": periods,
        "detections_per_s": round(periods / secs, 2),
        "detect_ms": round(det, 3),
        "compare_ms": round(cmp_, 3),
        "encode_ms_per_update": round(enc, 3),
        "send_ms_per_update": round(send, 3),
        "detection_time_ms": round(det + cmp_ + enc, 3),
        "client_updates_per_s": round((u1 - u0) / secs, 2),
        "pages_reported_per_period": round(reported / max(periods, 1), 1),
        "pages_changed_per_period": round(changed / max(periods, 1), 1),
        "useful_ratio": round(changed / reported, 3) if reported else None,
        "cpu_system_percent": round(100.0 * (cpu1[0] - cpu0[0]) / max(cpu1[1] - cpu0[1], 1), 1),
        "cpu_vmm_percent": round(100.0 * (p1 - p0) / secs, 1),
        "wp_faults": m1["tracker"]["wp_faults"] - m0["tracker"]["wp_faults"],
        "period_ms_end": m1["period_ms"],
        "cpu_display_thread_percent": m1.get("cpu_display_percent"),
        "kvm": kvm,
    }


def table2(args, tmp):
    """Both layouts' guests stay up, and each pattern runs on one and then
    the other, so the two columns see the same background load."""
    rows = {}
    vms = {}
    try:
        for pattern in PATTERNS:
            for layout in ["linear", "tiled"]:
                vm = vms.get(layout)
                # A fresh guest when the last one is gone (its failure is
                # recorded; the other patterns still run).
                if vm is None or vm.proc.poll() is not None:
                    if vm is not None:
                        vm.close()
                    vm = vms[layout] = Vm(args, tmp, layout, "dirtylog")
                cmd = "hk-fbdraw -p %s -t %d" % (pattern, args.seconds)
                if args.rates.get(pattern):
                    cmd += " -r %g" % args.rates[pattern]
                try:
                    before, after, m = vm.run(cmd, DRAW_RE, args.seconds)
                except RuntimeError as e:
                    print("table2 %s %s failed: %s" % (pattern, layout, e), flush=True)
                    rows.setdefault(pattern, {})[layout] = {"error": str(e)}
                    continue
                rec = window_figures(before, after)
                rec["ops_per_s"] = float(m.group(5))
                rows.setdefault(pattern, {})[layout] = rec
                print("table2 %-6s %-6s detection %.2f ms (detect %.2f compare %.2f encode %.2f)"
                      " pages %.0f/%.0f" % (pattern, layout, rec["detection_time_ms"],
                                             rec["detect_ms"], rec["compare_ms"],
                                             rec["encode_ms_per_update"],
                                             rec["pages_changed_per_period"],
                                             rec["pages_reported_per_period"]), flush=True)
    finally:
        for vm in vms.values():
            vm.close()
    return rows


def video(args, tmp):
    rows = {}
    vm = Vm(args, tmp, "tiled", "dirtylog")
    try:
        for method in METHODS:
            vm.display("--dirty", method)
            cmd = "hk-video -t %d" % args.seconds
            before, after, m = vm.run(cmd, VIDEO_RE, args.seconds)
            rec = window_figures(before, after)
            rec["guest_fps"] = float(m.group(3))
            # Per guest frame drawn in the window: the guest's speed differs
            # between methods here (not in the paper), so raw counts over
            # the window are not comparable on their own.
            frames = rec["guest_fps"] * rec["window_s"]
            for key in ["exits", "pf_fixed", "pf_taken"]:
                if key in rec["kvm"]:
                    rec[key + "_per_frame"] = round(rec["kvm"][key] / frames, 1) if frames else None
            rec["wp_faults_per_frame"] = round(rec["wp_faults"] / frames, 1) if frames else None
            rows[method] = rec
            print("video %-8s %.1f detections/s, cpu system %.1f%% vmm %.1f%%, exits %s, "
                  "wp faults %d" % (method, rec["detections_per_s"], rec["cpu_system_percent"],
                                     rec["cpu_vmm_percent"], rec["kvm"].get("exits"),
                                     rec["wp_faults"]), flush=True)
        latency = refresh_latency(args, vm)
    finally:
        vm.close()
    return rows, latency


def refresh_latency(args, vm):
    """After an idle stretch, time from sending a drawing command to the
    first update at the client, for refresh=timer and refresh=event, with
    wp and dirtylog."""
    out = {}
    for method in ["wp", "dirtylog"]:
        for refresh in ["timer", "event"]:
            vm.display("--dirty", method, "--refresh", refresh)
            samples = []
            for i in range(args.latency_runs):
                time.sleep(args.idle)  # let the period grow
                period = vm.display()["period_ms"]
                start = vm.con.size()
                t0 = time.monotonic()
                vm.con.send("hk-fbdraw -p fill -x %d -y 300 -w 40 -H 40 -c 0x%06x\n"
                            % (100 + 50 * i, 0x102030 * (i + 1) & 0xffffff))
                t_update = vm.probe.wait_update_after(t0, 30)
                m = vm.con.wait(DRAW_RE, start, 30)
                t_done = time.monotonic()
                vm.con.wait(PROMPT_RE, m.end() if m else start, 30)
                if t_update is None:
                    continue
                samples.append({"idle_period_ms": period,
                                "command_to_client_ms": round((t_update - t0) * 1e3, 1),
                                "console_done_ms": round((t_done - t0) * 1e3, 1)})
            lat = sorted(s["command_to_client_ms"] for s in samples)
            out["%s/%s" % (method, refresh)] = {
                "samples": samples,
                "median_ms": lat[len(lat) // 2] if lat else None,
            }
            print("latency %-8s %-5s median %s ms over %d" % (
                method, refresh, out["%s/%s" % (method, refresh)]["median_ms"], len(lat)),
                flush=True)
    vm.display("--dirty", "dirtylog", "--refresh", "timer")
    return out


def parse_rates(text):
    rates = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in PATTERNS or not value:
            raise SystemExit("--rates: expected PATTERN=OPS_PER_S,... (patterns: %s)"
                             % ", ".join(PATTERNS))
        rates[name] = float(value)
    return rates


def rig_l1():
    """Whether this runs inside the test rig's L1 (scripts/rig puts hk.run=
    on L1's kernel command line)."""
    try:
        with open("/proc/cmdline") as f:
            return " hk.run=" in " " + f.read()
    except OSError:
        return False


def ratio(a, b):
    return round(a / b, 2) if a and b else None


def write_md(path, r):
    L = ["# Display benchmark (seed 000)", "",
         "`%s` on %s; %s. 1 vCPU, 512 MiB, 1024x768 screen; a Raw client connected "
         "throughout; figures over the middle %d s of %d s runs." % (
             r["command"], r["date"], r["note"], r["window_s"], r["seconds"]), "",
         "## Table 2: update detection time, linear vs page-tiled (dirtylog)", "",
         "Ours = detect + compare per period + VNC encode per update (the paper's span: "
         "timer to compressed and queued). Paper: Xen HVM, 1024x768.", "",
         "| pattern | ours linear ms | ours tiled ms | tiled/linear | paper linear ms | "
         "paper tiled ms | paper tiled/linear | pages changed/reported linear | tiled | "
         "useful ratio linear | tiled | ops/s linear | tiled |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in PATTERNS:
        lin, til = r["table2"][p]["linear"], r["table2"][p]["tiled"]
        pl, pt = PAPER_TABLE2[p]
        if "error" in lin or "error" in til:
            L.append("| %s | failed: %s | | | %.1f | %.1f | | | | | | | |" % (
                p, (lin.get("error") or til.get("error"))[:200].replace("|", "/")
                .replace("\n", " "), pl, pt))
            continue
        L.append("| %s | %.2f | %.2f | %s | %.1f | %.1f | %.2f | %.0f/%.0f | %.0f/%.0f | %s | %s "
                 "| %.0f | %.0f |" % (
                     p, lin["detection_time_ms"], til["detection_time_ms"],
                     ratio(til["detection_time_ms"], lin["detection_time_ms"]), pl, pt, pt / pl,
                     lin["pages_changed_per_period"], lin["pages_reported_per_period"],
                     til["pages_changed_per_period"], til["pages_reported_per_period"],
                     lin["useful_ratio"], til["useful_ratio"], lin["ops_per_s"],
                     til["ops_per_s"]))
    L += ["", "Split (ms): detect / compare / encode per update / send per update.", "",
          "| pattern | layout | detect | compare | encode | send | detections/s |",
          "|---|---|---|---|---|---|---|"]
    for p in PATTERNS:
        for lay in ["linear", "tiled"]:
            x = r["table2"][p][lay]
            if "error" in x:
                continue
            L.append("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.1f |" % (
                p, lay, x["detect_ms"], x["compare_ms"], x["encode_ms_per_update"],
                x["send_ms_per_update"], x["detections_per_s"]))
    L += ["", "## Figures 11-12, table 3: 30 fps video (480x400, tiled)", "",
          "Counts are over the %d s window; *per frame* divides by the frames the guest drew "
          "in it (guest fps x window), since the guest's own speed differs between methods "
          "here. The paper's counts are Xen's, over its run; its shadow page faults "
          "correspond to KVM's pf_fixed/pf_taken (faults KVM fixed in its own page tables). "
          "CPU system = all of L1's CPUs from /proc/stat (the paper: its management "
          "domain); VMM = the hakoniwa process (vCPU included), %% of one CPU; display = "
          "the update thread alone, %% of one CPU (last second)." % r["window_s"], "",
          "| method | detections/s (paper) | guest fps | CPU system % (paper) | CPU VMM % | "
          "display thread % | exits (paper) | exits/frame | pf_fixed | pf_fixed/frame | "
          "wp faults | wp faults/frame |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in METHODS:
        x = r["video"][m]
        k = x["kvm"]
        L.append("| %s | %.1f (%s) | %.1f | %.1f (%s) | %.1f | %s | %s (%s) | %s | %s (%s) | %s "
                 "| %d | %s |" % (
                     m, x["detections_per_s"], PAPER_VIDEO["fps"].get(m, "-"), x["guest_fps"],
                     x["cpu_system_percent"], PAPER_VIDEO["cpu_percent"].get(m, "-"),
                     x["cpu_vmm_percent"], x.get("cpu_display_thread_percent"),
                     k.get("exits"), PAPER_VIDEO["exits"].get(m, "-"), x.get("exits_per_frame"),
                     k.get("pf_fixed"), PAPER_VIDEO["shadow_page_faults"].get(m, "-"),
                     x.get("pf_fixed_per_frame"), x["wp_faults"],
                     x.get("wp_faults_per_frame")))
    dv, wv = r["video"]["dirtylog"], r["video"]["wp"]
    d, w = dv["kvm"], wv["kvm"]
    L += ["", "wp / dirtylog over the window: exits %s, pf_fixed %s (paper: exits 2.7, "
          "shadow page faults 9.7); per guest frame: exits %s, pf_fixed %s." % (
              ratio(w.get("exits"), d.get("exits")), ratio(w.get("pf_fixed"), d.get("pf_fixed")),
              ratio(wv.get("exits_per_frame"), dv.get("exits_per_frame")),
              ratio(wv.get("pf_fixed_per_frame"), dv.get("pf_fixed_per_frame")))]
    L += [
          "", "## Refresh: timer vs event (beyond the paper)", "",
          "Command sent to the guest console after %.0f s idle -> first update at the client "
          "(median ms; includes the console and hk-fbdraw start, alike in both)." % r["idle_s"],
          "", "| method | timer | event |", "|---|---|---|"]
    for m in ["wp", "dirtylog"]:
        L.append("| %s | %s | %s |" % (m, r["latency"]["%s/timer" % m]["median_ms"],
                                        r["latency"]["%s/event" % m]["median_ms"]))
    L += ["", "Environment: %s" % r["environment"], ""]
    if r.get("figure"):
        L += ["![figure](%s)" % os.path.basename(r["figure"]), ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def plot(path, r):
    # A font cache that lasts (hk_pyenv builds it on the host; in the rig,
    # building it under TCG takes minutes).
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(ROOT, "build/pyenv/mplconfig"))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.5))
    x = range(len(PATTERNS))
    w = 0.2
    ours_l = [r["table2"][p]["linear"].get("detection_time_ms", 0) for p in PATTERNS]
    ours_t = [r["table2"][p]["tiled"].get("detection_time_ms", 0) for p in PATTERNS]
    ax[0].bar([i - 1.5 * w for i in x], ours_l, w, label="hakoniwa linear")
    ax[0].bar([i - 0.5 * w for i in x], ours_t, w, label="hakoniwa tiled")
    ax[0].bar([i + 0.5 * w for i in x], [PAPER_TABLE2[p][0] for p in PATTERNS], w,
              label="paper linear", alpha=0.5)
    ax[0].bar([i + 1.5 * w for i in x], [PAPER_TABLE2[p][1] for p in PATTERNS], w,
              label="paper tiled", alpha=0.5)
    ax[0].set_xticks(list(x), PATTERNS)
    ax[0].set_ylabel("update detection time per period (ms)")
    ax[0].set_title("Table 2: linear vs page-tiled (dirtylog)")
    ax[0].legend(fontsize=7)
    fps = [r["video"][m]["detections_per_s"] for m in METHODS]
    ax[1].bar(METHODS, fps, label="hakoniwa")
    ax[1].scatter(["dirtylog", "wp"], [28, 28], color="red", zorder=3, label="paper")
    ax[1].set_ylabel("detections per second")
    ax[1].set_title("Fig. 11: frame rate, 30 fps video")
    ax[1].legend(fontsize=7)
    cpu = [r["video"][m]["cpu_system_percent"] for m in METHODS]
    ax[2].bar(METHODS, cpu, label="hakoniwa (L1 /proc/stat)")
    ax[2].scatter(["dirtylog", "wp"], [6.5, 6.5], color="red", zorder=3, label="paper")
    ax[2].set_ylabel("CPU %")
    ax[2].set_title("Fig. 12: CPU utilisation")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hakoniwa", default=os.path.join(ROOT, "target/release/hakoniwa"))
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--idle", type=float, default=4.0)
    p.add_argument("--latency-runs", type=int, default=5)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--rates", default=DEFAULT_RATES,
                   help="hk-fbdraw ops per second per pattern in table 2, so both layouts "
                        "draw the same per period (0 = as fast as the guest can; default "
                        "%(default)s)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = p.parse_args()
    args.rates = parse_rates(args.rates)
    with tempfile.TemporaryDirectory() as tmp:
        t2 = table2(args, tmp)
        vid, lat = video(args, tmp)
    os.makedirs(args.out, exist_ok=True)
    in_rig = rig_l1()
    result = {
        "command": "scripts/bench-display",
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "note": "inside L1 (QEMU TCG, nested KVM); absolute times mean little, compare ratios"
        if in_rig else "on this host's KVM",
        "seconds": args.seconds, "window_s": args.window, "idle_s": args.idle,
        "table2": t2, "video": vid, "latency": lat,
        "paper": {"table2_ms": PAPER_TABLE2, "video": PAPER_VIDEO},
        "environment": "%s, kernel %s, %d CPUs" % (platform.node(), platform.release(),
                                                   os.cpu_count()),
    }
    result["figure"] = plot(os.path.join(args.out, "display.png"), result)
    with open(os.path.join(args.out, "display.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_md(os.path.join(args.out, "display.md"), result)
    print(open(os.path.join(args.out, "display.md")).read())


if __name__ == "__main__":
    main()
