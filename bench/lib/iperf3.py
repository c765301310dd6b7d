"""iperf3 (TCP) as the network benchmarks run it: the client's command
line and what one run's JSON report (`-J`) says: throughput as the
receiver counted it, the sender's retransmits, per-second throughput and
the CPU use iperf3 itself reports on either end, and the seconds in which
nothing arrived."""

import json
import statistics

from .tables import spread


def client_argv(server, port, seconds, reverse, iperf3="iperf3"):
    """One TCP test against SERVER:PORT of SECONDS, one stream, reports
    once a second, as JSON. REVERSE: the server sends (-R), so the client
    measures its receive path."""
    argv = [iperf3, "-c", server, "-p", str(port), "-t", str(seconds), "-i", "1", "-J",
            "--connect-timeout", "10000"]
    return argv + (["-R"] if reverse else [])


def parse_report(text):
    """One run from iperf3's JSON report TEXT: {"mbit_s" (what the
    receiver got), "sender_mbit_s", "retransmits" (the sender's; None
    where iperf3 does not report them), "interval_mbit_s" (per second, as
    the client saw it), "cpu_client_pct", "cpu_server_pct", "seconds"}.
    Raises ValueError with iperf3's own error, or what is missing."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no iperf3 report: %r" % text[-300:])
    try:
        r = json.loads(text[start:text.rfind("}") + 1])
    except ValueError as e:
        raise ValueError("unreadable iperf3 report (%s): %r" % (e, text[-300:])) from None
    if r.get("error"):
        raise ValueError("iperf3: %s" % r["error"])
    end = r.get("end") or {}
    sent, recv = end.get("sum_sent"), end.get("sum_received")
    if not sent or not recv:
        raise ValueError("iperf3 report without sum_sent/sum_received: %r" % text[-300:])
    cpu = end.get("cpu_utilization_percent") or {}
    return {
        "mbit_s": recv["bits_per_second"] / 1e6,
        "sender_mbit_s": sent["bits_per_second"] / 1e6,
        "retransmits": sent.get("retransmits"),
        "seconds": recv.get("seconds"),
        "bytes": recv.get("bytes"),
        "interval_mbit_s": [round(i["sum"]["bits_per_second"] / 1e6, 3)
                            for i in r.get("intervals", []) if i.get("sum")],
        # Whole seconds in which not one byte arrived: a stalled connection.
        "silent_seconds": sum(1 for i in r.get("intervals", [])
                              if i.get("sum") and i["sum"].get("bytes") == 0
                              and i["sum"].get("seconds", 0) >= 0.5),
        "cpu_client_pct": cpu.get("host_total"),
        "cpu_server_pct": cpu.get("remote_total"),
    }


def summarize(runs):
    """The spread of the runs' throughput (`tables.spread` of mbit_s), of
    all their per-second samples (the jitter within runs: "interval"), and
    the retransmits per run; None entries where there are no runs."""
    ok = [r for r in runs if r.get("ok")]
    per_second = [x for r in ok for x in r.get("interval_mbit_s", [])]
    retr = [r["retransmits"] for r in ok if r.get("retransmits") is not None]
    return {
        "mbit_s": spread([r["mbit_s"] for r in ok]),
        "interval_mbit_s": spread(per_second),
        "interval_cv": (statistics.pstdev(per_second) / statistics.fmean(per_second)
                        if len(per_second) > 1 and statistics.fmean(per_second) else None),
        "retransmits": spread(retr),
        "interrupts": spread([r["interrupts"] for r in ok if r.get("interrupts") is not None]),
        "stalled_runs": sum(1 for r in ok if r.get("silent_seconds")),
    }
