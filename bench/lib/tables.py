"""Tables of rows (lists of cells, the first row the header) as plain text
for the terminal and as Markdown for bench/results/, and the cells of
summaries: median (min-max), ratios, and a sample's spread (mean,
variance, percentiles)."""

import statistics


def text_table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cell(row, key, fmt):
    """row[key] formatted with fmt ("%.1f"), or "-" where it is missing."""
    return fmt % row[key] if row.get(key) is not None else "-"


def md_table(rows):
    out = ["| " + " | ".join(rows[0]) + " |",
           "|" + "|".join("---" for _ in rows[0]) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows[1:]]
    return "\n".join(out)


def md_context(env, in_rig):
    """Markdown lines that say where the figures come from: the note of
    the environment section ENV, and in the rig IN_RIG, what the rig does
    to them."""
    lines = ["**Context: %s.**" % env["note"], ""]
    if env["where"] == "rig":
        lines += [in_rig, ""]
    return lines


def md_command_lines(argv):
    """Markdown bullets of each VMM's command line (ARGV: name -> argv)."""
    return ["- %s: `%s`" % (name, " ".join(a)) for name, a in argv.items()]


def md_environment(env):
    """Markdown bullets of an environment section ENV: a dict value as
    "key: value, ...", a list as "a; b" ("-" when empty)."""
    lines = []
    for k, val in env.items():
        if isinstance(val, dict):
            val = ", ".join("%s: %s" % kv for kv in val.items())
        elif isinstance(val, list):
            val = "; ".join(str(v) for v in val) or "-"
        lines.append("- %s: %s" % (k, val))
    return lines


def stats(vals):
    """{"median", "min", "max", "n"} of the numbers VALS; None for none."""
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals)}


def percentile(vals, p):
    """The P-th percentile (0-100) of the numbers VALS, interpolated
    linearly between the closest ranks (numpy's default, "inclusive"
    quantiles): p50 is the median, p100 the maximum; None for none."""
    if not vals:
        return None
    s = sorted(vals)
    pos = (len(s) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(vals):
    """`stats` of the numbers VALS and how they spread: "mean", "variance"
    (the sample variance, n - 1; 0 for one value), "stdev", "range" (max -
    min), "p50" and "p99" (`percentile`); None for none. For run-to-run
    jitter: a table of min, max, max - min, p50 and p99 per cell."""
    if not vals:
        return None
    d = stats(vals)
    var = statistics.variance(vals) if len(vals) > 1 else 0.0
    d.update({"mean": statistics.fmean(vals), "variance": var, "stdev": var ** 0.5,
              "range": d["max"] - d["min"], "p50": percentile(vals, 50),
              "p99": percentile(vals, 99)})
    return d


def fmt_range(d, fmt, div=1):
    """A `stats` dict as "median (min-max)", each divided by DIV and
    formatted with FMT ("%.1f"); "-" for none."""
    if not d:
        return "-"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (d["median"] / div, d["min"] / div,
                                                   d["max"] / div)


def fmt_ratio(x):
    return "-" if x is None else "%.2f" % x
