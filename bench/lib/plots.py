"""matplotlib for the benchmarks' figures, where it is importable (the
project's Python environment, build/pyenv, has it: scripts/lib/pyenv.sh);
the scripts write their tables without it."""

import os

from . import ROOT


def pyplot():
    """matplotlib.pyplot drawing into files (the Agg backend), or None
    when matplotlib is not importable. Its font cache is
    build/pyenv/mplconfig unless MPLCONFIGDIR says otherwise: a cache that
    lasts (hk_pyenv builds it on the host; in the rig, building it under
    TCG takes minutes)."""
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(ROOT, "build/pyenv/mplconfig"))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def panels(rows, cols, figsize, **kwargs):
    """A figure of ROWS x COLS plots: (the figure, its axes in reading
    order), or (None, None) when matplotlib is not importable. KWARGS go
    to pyplot.subplots."""
    plt = pyplot()
    if plt is None:
        return None, None
    fig, axes = plt.subplots(rows, cols, figsize=figsize, **kwargs)
    return fig, axes.flat


def save_figure(fig, path, dpi):
    """Lays FIG out, writes it to PATH (a PNG of DPI dots per inch) and
    lets it go."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
