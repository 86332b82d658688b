"""What a GPU costs by the hour, and what serving at a rate then costs: dollars per hour and per million output
tokens.

    usd_per_hour                 = gpu_hour_price × num_gpus            (every GPU of every replica, busy or not)
    usd_per_million_output_tokens = usd_per_hour / (rate × mean_output_tokens × 3,600 s) × 10⁶

At a capacity answer every offered request is served (the run sustained it: kvlab.window), so the output tokens a
second are the rate times the workload's mean answer length. Prices are on-demand list prices, which move: each
has its date and source, and ``--gpu-hour-price`` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError


@dataclass(frozen=True, slots=True)
class GpuPrice:
    usd_per_gpu_hour: float
    as_of: str
    source: str


# The midpoints of "typical on-demand range, early 2026" (A100 80GB SXM $1.49–$2.49, H100 SXM 80GB $2.49–$3.99 a
# GPU-hour, across Lambda, CoreWeave, RunPod, vast.ai, Crusoe): pricegpu.pages.dev/blog/h100-vs-a100-cloud-price.
_SOURCE = "midpoint of the typical on-demand range in pricegpu.pages.dev/blog/h100-vs-a100-cloud-price"
PRICES: dict[str, GpuPrice] = {
    "A100-80GB": GpuPrice(1.99, "2026-01", _SOURCE + " ($1.49–$2.49)"),
    "H100-SXM": GpuPrice(3.24, "2026-01", _SOURCE + " ($2.49–$3.99)"),
}


def gpu_hour_price(gpu_id: str, override: float | None = None) -> GpuPrice | None:
    """The price of one GPU-hour of ``gpu_id``: ``override`` (--gpu-hour-price) when given, else the catalogue's,
    else None (no price known: the answer says so). A price that is not a positive number is refused."""
    if override is not None:
        if not override > 0 or override == float("inf"):
            raise KvlabError(f"--gpu-hour-price {override:g}: a GPU-hour's price in US dollars must be a positive "
                             "number, e.g. 2.5")
        return GpuPrice(float(override), "given", "--gpu-hour-price")
    from kvlab.catalog.models import name_key

    return next((p for gpu, p in PRICES.items() if name_key(gpu) == name_key(gpu_id)), None)


def serving_cost(price: GpuPrice, num_gpus: int, rate_rps: float, mean_output_tokens: float) -> dict[str, float | None]:
    """Dollars per hour of ``num_gpus`` GPUs, and per million output tokens when they serve ``rate_rps`` requests
    a second of ``mean_output_tokens`` each (None at rate 0)."""
    per_hour = price.usd_per_gpu_hour * num_gpus
    tokens_per_hour = rate_rps * mean_output_tokens * 3600
    return {"usd_per_hour": per_hour,
            "usd_per_million_output_tokens": per_hour / tokens_per_hour * 1e6 if tokens_per_hour > 0 else None}


def price_text(price: GpuPrice) -> str:
    if price.as_of == "given":
        return f"${price.usd_per_gpu_hour:g} a GPU-hour (--gpu-hour-price)"
    return f"${price.usd_per_gpu_hour:g} a GPU-hour ({price.as_of}, {price.source}; --gpu-hour-price to change)"
