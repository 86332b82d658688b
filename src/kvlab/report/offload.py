"""What a CPU tier did in a run (kvlab.offload's counters, the JSON summary's fields), in words."""

from __future__ import annotations

from kvlab.report.text import plural


def cpu_tier_line(summary: dict) -> str | None:
    """One strategy's CPU tier: the prompt tokens it served that would have been computed again, the blocks it
    stored, loaded back and evicted, and their bytes; None for a strategy without a tier."""
    if not summary.get("num_cpu_blocks"):
        return None
    gib = 2**30
    stored, loaded = summary["offload_stored_blocks"], summary["offload_loaded_blocks"]
    return (f"{summary['name']}: CPU tier served {plural(summary['cpu_prefix_hit_tokens'], 'prompt token')} from "
            f"{plural(loaded, 'block')} loaded back ({summary['offload_loaded_bytes'] / gib:.2f} GiB over the host "
            f"link), against {plural(summary['gpu_prefix_hit_tokens'], 'token')} hit on the GPU; over the run it "
            f"stored {plural(stored, 'block')} ({summary['offload_stored_bytes'] / gib:.2f} GiB) in its "
            f"{summary['num_cpu_blocks']:,} and evicted {summary['offload_evicted_blocks']:,}, least recently used "
            "first.")
