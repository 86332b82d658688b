"""PNG plots of ``kvlab bench --compare`` (matplotlib, imported here only): measured beside simulated.
Each function takes the series compare.py computed and a path, and draws; nothing here computes."""

from __future__ import annotations

from pathlib import Path

from kvlab.bench.compare import Series

MEASURED, SIMULATED = "#D55E00", "#0072B2"  # Okabe–Ito, as kvlab's other plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _over_time(path: Path, panels: list[tuple[str, str, float]], measured: dict[str, Series],
               simulated: dict[str, Series], title: str) -> Path:
    """One panel per (series key, y label, scale): the measured samples as steps, the simulation's iterations."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, label, scale) in zip(axes[:, 0], panels):
        sim, real = simulated[key], measured[key]
        ax.step(sim.time, [v * scale for v in sim.value], where="post", color=SIMULATED, label="simulated (kvlab)")
        ax.step(real.time, [v * scale for v in real.value], where="post", color=MEASURED, label="measured (/metrics)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("time since the bench started (s)")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_kv_cache_usage(measured, simulated, path: Path) -> Path:
    return _over_time(path, [("kv_cache_usage", "KV cache usage (%)", 100.0)], measured, simulated,
                      "KV cache usage: used blocks / all but the null block")


def plot_running_waiting(measured, simulated, path: Path) -> Path:
    return _over_time(path, [("num_running", "running", 1.0), ("num_waiting", "waiting", 1.0)], measured,
                      simulated, "Requests running and waiting")


def plot_preemptions(measured, simulated, path: Path) -> Path:
    return _over_time(path, [("preemptions", "preemptions so far", 1.0)], measured, simulated, "Preemptions")


def plot_latencies(latencies: dict[str, tuple[list[float], list[float]]], path: Path) -> Path:
    """One CDF per latency (TTFT, TPOT, e2e), measured beside simulated."""
    import numpy as np

    plt = _pyplot()
    titles = {"ttft": "TTFT (s)", "tpot": "TPOT (s)", "e2e_latency": "end-to-end latency (s)"}
    fig, axes = plt.subplots(1, len(latencies), figsize=(4 * len(latencies), 3.2), squeeze=False)
    for ax, (key, (real, sim)) in zip(axes[0], latencies.items()):
        for values, colour, label in ((sim, SIMULATED, "simulated"), (real, MEASURED, "measured")):
            if values:
                ordered = np.sort(values)
                ax.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post", color=colour,
                        label=label)
        ax.set_xlabel(titles[key])
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_comparison(measured, simulated, latencies, out_dir: Path) -> list[Path]:
    return [
        plot_kv_cache_usage(measured, simulated, out_dir / "compare_kv_cache_usage.png"),
        plot_running_waiting(measured, simulated, out_dir / "compare_running_waiting.png"),
        plot_preemptions(measured, simulated, out_dir / "compare_preemptions.png"),
        plot_latencies(latencies, out_dir / "compare_latency.png"),
    ]
