"""Prints what the paper's stand-ins look like: the table in docs/workloads.md ("The paper's stand-ins").

    python scripts/describe_stand_ins.py [--requests 1000000] [--seed 0]

needs no trace: both stand-ins are kvlab's own (kvlab.workload.synthetic).
"""

from __future__ import annotations

import argparse

import numpy as np

from kvlab.workload import WORKLOADS
from kvlab.workload.synthetic import paper_alpaca_fit, paper_sharegpt_fit, paper_sharegpt_population


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    a, b = paper_sharegpt_fit()
    population = paper_sharegpt_population()
    longest = int((population.prompt_len + population.output_len).max())
    print(f"paper-sharegpt: scale factors a = {a:.6f} (prompts), b = {b:.6f} (outputs); population of "
          f"{population.num_rows:,} rows ({population.num_skipped} over 2,048 dropped); means "
          f"{population.prompt_len.mean():.3f} / {population.output_len.mean():.3f}; longest {longest:,} tokens")
    (prompt_mu, prompt_sigma), (output_mu, output_sigma) = paper_alpaca_fit()
    print(f"paper-alpaca: sigma {prompt_sigma:.4f} / {output_sigma:.4f}, mu {prompt_mu:.4f} / {output_mu:.4f}")
    print(f"\n{args.requests:,} requests, seed {args.seed}:\n")
    print("| | mean | std | p50 | p90 | p99 | max | E[X²]/E[X] |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("paper-sharegpt", "paper-alpaca"):
        table = WORKLOADS[name].sample(args.requests, np.random.default_rng(args.seed))
        for column, values in (("prompt", table.prompt_len), ("output", table.output_len),
                               ("prompt + output", table.prompt_len + table.output_len)):
            x = values.astype(float)
            p50, p90, p99 = np.percentile(x, [50, 90, 99])
            print(f"| {name} {column} | {x.mean():.1f} | {x.std():.1f} | {p50:,.0f} | {p90:,.0f} | {p99:,.0f} | "
                  f"{x.max():,.0f} | {(x * x).mean() / x.mean():.1f} |")


if __name__ == "__main__":
    main()
