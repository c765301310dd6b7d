"""matplotlib for the benchmarks' figures, where it is importable (the
project's Python environment, build/pyenv, has it: scripts/lib/pyenv.sh);
the scripts write their tables without it."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
