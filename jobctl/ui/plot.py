"""GPU memory over time as a picture (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from jobctl.errors import UsageError


def import_pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display); UsageError when the
    optional `plot` extra is not installed."""

    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is an optional extra and is not installed",
                         hint="pip install 'jobctl[plot]'  (or: pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


GIB = 1 << 30
LEGEND_MAX_GPUS = 16  # more lines than this: one colour and one legend entry per node


def plot_memory(series: dict, predicted: int | None, usable: int | None, path: str | Path, title: str) -> None:
    """GPU memory over time, one line per node/GPU, with the predicted peak and the usable
    limit as horizontal lines; written to `path` (the format follows its extension)."""
    plt = import_pyplot()
    span = max((xs[-1] for xs, _ in series.values()), default=0.0)
    unit, scale = ("min", 60.0) if span > 600 else ("s", 1.0)
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    try:
        by_node = len(series) > LEGEND_MAX_GPUS
        nodes = sorted({n for n, _ in series})
        colours = plt.get_cmap("tab10" if (len(nodes) if by_node else len(series)) <= 10 else "tab20")
        labelled = set()
        for i, ((node, gpu), (xs, ys)) in enumerate(sorted(series.items())):
            if by_node:
                count = sum(1 for n, _ in series if n == node)
                colour, label = colours(nodes.index(node) % colours.N), f"node {node} ({count} GPUs)"
                label = None if node in labelled else label
                labelled.add(node)
            else:
                colour, label = colours(i % colours.N), f"node {node} gpu {gpu}"
            ax.plot([x / scale for x in xs], [y / GIB for y in ys], color=colour, linewidth=1.4, label=label,
                    marker="o" if len(xs) == 1 else None)
        if predicted:
            ax.axhline(predicted / GIB, color="black", linestyle="--", linewidth=1.5,
                       label=f"predicted peak {predicted / GIB:,.2f} GiB")
        if usable:
            ax.axhline(usable / GIB, color="red", linestyle=":", linewidth=1.8,
                       label=f"usable limit {usable / GIB:,.2f} GiB")
        ax.set_xlabel(f"time since the first sample ({unit})")
        ax.set_ylabel("GPU memory used (GiB = 2^30 bytes)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
