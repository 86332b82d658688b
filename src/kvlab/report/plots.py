"""PNG plots of a race (matplotlib, imported here only): memory shares over time, batch size over time,
latency distributions. Each function takes SimResults and a path, and draws; nothing here computes metrics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.sim import SimResult

# Okabe–Ito: distinguishable for colour-blind readers.
STATE_COLOURS = {
    "token": "#0072B2",
    "reserved": "#56B4E9",
    "internal_fragmentation": "#E69F00",
    "external_fragmentation": "#BBBBBB",
    "overhead": "#D55E00",
    "free": "#DDDDDD",
}
# The memory plot's states as a reader should read them: free memory is free (for paged memory it is not
# fragmentation at all), and the allocator's own overhead (a buddy's round-up, vLLM's null block, a hybrid model's
# other KV cache groups' blocks: kvlab.memory.hybrid) is apart.
STATE_LABELS = {"token": "tokens", "reserved": "reserved", "internal_fragmentation": "internal fragmentation",
                "overhead": "allocator overhead (round-up, null block, a hybrid's other groups)", "free": "free"}
LINE_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _binned(time, values, weights, num_bins: int = 200):
    """Duration-weighted means of ``values`` over equal time bins (a run has up to millions of iterations)."""
    import numpy as np

    time = np.asarray(time)
    if len(time) == 0:
        return np.array([]), np.array([])
    edges = np.linspace(time[0], time[-1] + 1e-12, num_bins + 1)
    idx = np.clip(np.searchsorted(edges, time, side="right") - 1, 0, num_bins - 1)
    w = np.bincount(idx, weights=weights, minlength=num_bins)
    v = np.bincount(idx, weights=np.asarray(values) * weights, minlength=num_bins)
    keep = w > 0
    centres = (edges[:-1] + edges[1:]) / 2
    return centres[keep], v[keep] / w[keep]


def plot_memory_shares(results: list[SimResult], path: Path) -> Path:
    """One stacked area per strategy: the share of KV memory in each state over time."""
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results) + 0.6), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        cols = result.log.columns
        dt = np.asarray(cols["duration"])
        capacity = result.config.cache.num_slots
        series = {
            "token": np.asarray(cols["token"]),
            "reserved": np.asarray(cols["reserved"]),
            "internal_fragmentation": np.asarray(cols["internal_fragmentation"]),
            "overhead": np.asarray(cols["overhead"]),
            "free": np.asarray(cols["free"]),
        }
        t = None
        stacks = []
        for values in series.values():
            t, v = _binned(cols["time"], 100.0 * values / capacity, dt)
            stacks.append(v)
        if t is not None and len(t):
            ax.stackplot(t, *stacks, colors=[STATE_COLOURS[k] for k in series], labels=[STATE_LABELS[k] for k in series])
        else:  # (no iteration ran: every request was rejected)
            _say_nothing_served(ax)
        share = result.summary()["memory_shares"]["token"]
        ax.set_title(f"{result.strategy.name}: {share:.1f}% of KV memory holds tokens (time average)", fontsize=10)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of KV slots")
    # The states' legend, at the top, from the first strategy that drew them (none did where none served anything)
    drawn = next((ax for ax in axes[:, 0] if ax.get_legend_handles_labels()[0]), None)
    if drawn is not None:
        axes[0, 0].legend(*drawn.get_legend_handles_labels(), loc="upper right", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_batch_size(results: list[SimResult], path: Path) -> Path:
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for colour, result in zip(LINE_COLOURS, results):
        cols = result.log.columns
        t, v = _binned(cols["time"], cols["num_seqs"], np.asarray(cols["duration"]))
        ax.plot(t, v, color=colour, label=f"{result.strategy.name} (mean {result.integral.mean_batch_size:.1f})")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per iteration")
    ax.set_title("Batch size over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency(results: list[SimResult], path: Path) -> Path:
    """Cumulative distributions of normalized latency (s/token) and TTFT."""
    import numpy as np

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for colour, result in zip(LINE_COLOURS, results):
        done = [r for r in result.records if r.status == "finished"]
        for ax, values in (
            (ax1, [r.normalized_latency for r in done]),
            (ax2, [r.ttft for r in done]),
        ):
            x = np.sort(np.asarray(values, dtype=float))
            if len(x):
                ax.plot(x, np.arange(1, len(x) + 1) / len(x), color=colour, label=result.strategy.name)
    ax1.set_xlabel("normalized latency (s / output token)")
    ax2.set_xlabel("time to first token (s)")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:  # (a strategy that finished no request draws no line)
        ax1.legend(fontsize=8)
    else:
        _say_nothing_served(ax1)
        _say_nothing_served(ax2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _say_nothing_served(ax) -> None:
    ax.text(0.5, 0.5, "no request served", ha="center", va="center", transform=ax.transAxes, fontsize=9, color="#666666")


RACE_PLOTS = ("memory_shares.png", "batch_size.png", "latency.png")  # what plot_race writes


def plot_race(results: list[SimResult], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    shares, batch, latency = (out_dir / name for name in RACE_PLOTS)
    return [plot_memory_shares(results, shares), plot_batch_size(results, batch), plot_latency(results, latency)]


def plot_fig2(rows, path: Path) -> Path:
    """kvlab's Figure 2 next to the paper's: one stacked bar per system and source."""
    plt = _pyplot()
    keys = ("token", "reserved", "internal_fragmentation", "external_fragmentation")
    labels = ("token states", "reservation", "internal fragmentation", "external fragmentation & other")
    fig, ax = plt.subplots(figsize=(9, 4))
    names, stacks = [], {k: [] for k in keys}
    for row in rows:
        for source, shares in (("kvlab", row.shares), ("paper", row.paper)):
            names.append(f"{row.system}\n{source}")
            known = {k: shares.get(k) for k in keys}
            if source == "paper" and known["reserved"] is None:  # vLLM: only the token share is published
                known = {"token": known["token"], "reserved": 0.0, "internal_fragmentation": 0.0,
                         "external_fragmentation": 100.0 - known["token"]}
            for k in keys:
                stacks[k].append(known[k] or 0.0)
    bottom = [0.0] * len(names)
    hatches = {"token": "", "reserved": "//", "internal_fragmentation": "xx", "external_fragmentation": ".."}
    for k, label in zip(keys, labels):
        ax.bar(names, stacks[k], bottom=bottom, color=STATE_COLOURS[k], hatch=hatches[k], edgecolor="white",
               label=label)
        bottom = [b + v for b, v in zip(bottom, stacks[k])]
    for i, v in enumerate(stacks["token"]):
        ax.text(i, v / 2, f"{v:.1f}", ha="center", va="center", color="white", fontsize=8, fontweight="bold")
    ax.set_ylabel("% of KV cache memory")
    ax.set_ylim(0, 100)
    ax.set_title("vLLM paper Figure 2: where KV memory goes (kvlab simulation vs the paper)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
