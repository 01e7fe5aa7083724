"""The result as a picture (--plot): M hits/s per trigger row, drawn with matplotlib."""

from __future__ import annotations

from urewrite.bench.common import BenchError


def plot(result: dict, path: str) -> None:
    """A horizontal bar chart of M hits/s per row (1 thread, log scale). Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("--plot needs matplotlib (pip install matplotlib)")
    rows = [r for r in result["trigger"]["rows"] if r["threads"] == 1 and r["mhits_per_s"]]
    colours = {"usermode": "#888888", "kernel": "#d62728", "bpftrace": "#ff7f0e",
               "urewrite": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.6))
    names = [r["name"] for r in rows][::-1]
    values = [r["mhits_per_s"] for r in rows][::-1]
    ax.barh(names, values, color=[colours[r["tool"]] for r in rows][::-1])
    ax.set_xscale("log")
    ax.set_xlabel("M hits/s (log scale; higher is better)")
    m = result["machine"]
    ax.set_title(f"urewrite bench: {m['cpu']}, Linux {m['kernel']}, {m['date'].split()[0]}",
                 fontsize=9)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.0f}" if v >= 100 else f" {v:.3g}", va="center", fontsize=7)
    from matplotlib.patches import Patch
    labels = {"usermode": "no probe", "kernel": "kernel uprobe (tracefs)",
              "bpftrace": "kernel uprobe (bpftrace)", "urewrite": "urewrite"}
    tools = [t for t in labels if any(r["tool"] == t for r in rows)]
    ax.legend([Patch(color=colours[t]) for t in tools], [labels[t] for t in tools],
              loc="lower right", fontsize=8)
    ax.set_xlim(right=max(values) * 8)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
