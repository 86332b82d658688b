"""The routing experiments docs/fleet.md reports and tests/test_fleet_routing.py asserts, on the vLLM paper's setup
(OPT-13B on one A100-40GB per replica, the paper's 12 GiB of KV cache):

    python -m kvlab.fleet.experiments          # the three, as docs/fleet.md prints them (about a minute)

- ``random_split``: N replicas behind ``random`` at N·r req/s (Poisson) against one replica at r. Random routing
  thins a Poisson process into N Poisson processes at r, so each replica should serve as a lone engine at r does.
  TTFT: a two-sample Kolmogorov-Smirnov test of each replica's TTFTs against a lone run's. TPOT: requests that
  decode together share their iterations, so within a run TPOTs are strongly correlated and their sampling error
  is the spread from run to run: a Welch t-test of the replicas' mean TPOTs against independent lone runs'. A
  control at 1.25·r shows that both tests see a change of load.
- ``bursty``: gamma arrivals with CV 3 near the replicas' capacity: p99 TTFT under least-requests and round-robin.
- ``sessions``: multi-turn sessions (kvlab.workload.sessions) with prefix caching: prefix hit rate and mean TTFT
  under prefix and round-robin.
- ``shared_system_prompt``: the same sessions all opening with one system prompt, where the prefix router
  follows the cache onto one replica and the weighted router (prefix and load) spreads them.
- ``mooncake``: the bundled real multi-turn trace on long-context replicas (printed, not asserted).
"""

from __future__ import annotations

from functools import cache

import numpy as np

PAPER_SETUP = dict(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)


@cache
def _config():
    from kvlab.config import resolve

    return resolve(PAPER_SETUP).engine


def _finished(records) -> list:
    return [r for r in records if r.status == "finished"]


def _ttft(records) -> np.ndarray:
    return np.array([r.ttft for r in _finished(records)])


def _mean_tpot(records) -> float:
    return float(np.mean([r.tpot for r in _finished(records) if r.tpot is not None]))


def random_split(*, num_replicas: int = 4, rate: float = 2.0, per_replica: int = 1500, seed: int = 1,
                 lone_seeds: tuple[int, ...] = tuple(range(100, 108)), control: float = 1.25) -> dict:
    """p-values: per replica, KS of its TTFTs against the first lone run's; Welch's t of the replicas' mean TPOTs
    against the lone runs'; the same against lone runs at ``control``·r."""
    from scipy.stats import ks_2samp, ttest_ind

    from kvlab.fleet.fleet import Fleet
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    strategy, config = parse_strategy("vllm"), _config()
    fleet = Fleet(strategy, config, load_workload("paper-sharegpt", rate=num_replicas * rate,
                                                  num_requests=num_replicas * per_replica, seed=seed),
                  "random", num_replicas, record_iterations=False).run()

    def lone(at: float, lone_seed: int):
        workload = load_workload("paper-sharegpt", rate=at, num_requests=per_replica, seed=lone_seed)
        return Simulation(strategy, config, workload, record_iterations=False).run().records

    replica_tpot = [_mean_tpot(r.records) for r in fleet.replicas]
    result = {"num_replicas": num_replicas, "rate": rate, "per_replica": per_replica,
              "replica_num_requests": [len(r.records) for r in fleet.replicas], "replica_mean_tpot": replica_tpot}
    for name, at in (("same", rate), ("control", control * rate)):
        runs = [lone(at, s) for s in lone_seeds]
        result[name] = {
            "rate": at,
            "ttft_ks_p": [float(ks_2samp(_ttft(r.records), _ttft(runs[0])).pvalue) for r in fleet.replicas],
            "lone_mean_tpot": [_mean_tpot(run) for run in runs],
            "tpot_t_p": float(ttest_ind(replica_tpot, [_mean_tpot(run) for run in runs], equal_var=False).pvalue),
        }
    return result


def bursty(*, num_replicas: int = 4, rate: float = 2.5, cv: float = 3.0, num_requests: int = 4000,
           seeds: tuple[int, ...] = (0, 1), routers: tuple[str, ...] = ("round-robin", "least-requests")) -> dict:
    """Per seed and router: p99 and mean TTFT, N replicas at N·rate req/s with gamma arrivals of ``cv``."""
    from kvlab.fleet.fleet import Fleet
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    out: dict = {}
    for seed in seeds:
        workload = load_workload("paper-sharegpt", rate=num_replicas * rate, num_requests=num_requests,
                                 arrival="gamma", cv=cv, seed=seed)
        for router in routers:
            fleet = Fleet(parse_strategy("vllm"), _config(), workload, router, num_replicas,
                          record_iterations=False).run().summary()["fleet"]
            out[(seed, router)] = {"p99_ttft_s": fleet["ttft_s"]["p99"], "mean_ttft_s": fleet["ttft_s"]["mean"]}
    return out


def sessions(*, num_replicas: int = 4, rate: float = 1.0, num_requests: int = 2000, seeds: tuple[int, ...] = (0, 1),
             routers: tuple[str, ...] = ("round-robin", "prefix")) -> dict:
    """Per seed and router: prefix hit rate and mean TTFT on the default sessions at N·rate req/s."""
    from kvlab.fleet.fleet import Fleet
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    out: dict = {}
    for seed in seeds:
        workload = load_workload("sessions", rate=num_replicas * rate, num_requests=num_requests, seed=seed)
        for router in routers:
            summary = Fleet(parse_strategy("vllm+prefix"), _config(), workload, router, num_replicas,
                            record_iterations=False).run().summary()
            out[(seed, router)] = {"prefix_hit_rate": summary["prefix_hit_rate"],
                                   "mean_ttft_s": summary["fleet"]["ttft_s"]["mean"],
                                   "p99_ttft_s": summary["fleet"]["ttft_s"]["p99"]}
    return out


def shared_system_prompt(*, num_replicas: int = 4, rate: float = 1.0, num_requests: int = 2000, seed: int = 0,
                         routers: tuple[str, ...] = ("round-robin", "least-requests", "prefix", "weighted")) -> dict:
    """Sessions that all open with one 256-token system prompt: per router, prefix hit rate, mean TTFT, load
    imbalance and the requests each replica got."""
    from kvlab.fleet.fleet import Fleet
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload
    from kvlab.workload.sessions import SessionSpec

    workload = load_workload("sessions", rate=num_replicas * rate, num_requests=num_requests, seed=seed,
                             sessions=SessionSpec(system_prompt_len=256))
    out: dict = {}
    for router in routers:
        summary = Fleet(parse_strategy("vllm+prefix"), _config(), workload, router, num_replicas,
                        record_iterations=False).run().summary()
        out[summary["router"]] = {"prefix_hit_rate": summary["prefix_hit_rate"],
                                  "mean_ttft_s": summary["fleet"]["ttft_s"]["mean"],
                                  "load_imbalance": summary["load_imbalance"],
                                  "per_replica": summary["decisions"]["per_replica"]}
    return out


def mooncake(*, num_replicas: int = 4, num_requests: int = 1500,
             routers: tuple[str, ...] = ("round-robin", "least-requests", "prefix", "weighted")) -> dict:
    """The real multi-turn trace, mooncake-conversation (its own arrivals), on Llama-3.1-8B replicas on one H100
    SXM each with a 131,072-token context: per router, prefix hit rate, mean and p99 TTFT, load imbalance."""
    from kvlab.config import resolve
    from kvlab.fleet.fleet import Fleet
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=131072).engine
    workload = load_workload("mooncake-conversation", num_requests=num_requests)
    out: dict = {}
    for router in routers:
        summary = Fleet(parse_strategy("vllm+prefix"), config, workload, router, num_replicas,
                        record_iterations=False).run().summary()
        out[summary["router"]] = {"prefix_hit_rate": summary["prefix_hit_rate"],
                                  "mean_ttft_s": summary["fleet"]["ttft_s"]["mean"],
                                  "p99_ttft_s": summary["fleet"]["ttft_s"]["p99"],
                                  "load_imbalance": summary["load_imbalance"]}
    return out


def main() -> None:
    split = random_split()
    print(f"random split: {split['num_replicas']} replicas at {split['num_replicas'] * split['rate']:g} req/s "
          f"against one at r ({split['per_replica']:,} requests each; replicas got {split['replica_num_requests']})")
    for name in ("same", "control"):
        entry = split[name]
        ks = ", ".join(f"{p:.3g}" for p in entry["ttft_ks_p"])
        print(f"  lone at {entry['rate']:g} req/s: TTFT KS p per replica {ks}; mean TPOT replicas "
              f"{np.mean(split['replica_mean_tpot']) * 1e3:.3f} ms vs lone runs "
              f"{np.mean(entry['lone_mean_tpot']) * 1e3:.3f} ms, Welch p {entry['tpot_t_p']:.3g}")
    print("bursty (gamma CV 3, 4 replicas at 10 req/s, 4,000 requests): p99 / mean TTFT")
    for (seed, router), v in bursty().items():
        print(f"  seed {seed} {router:<15} {v['p99_ttft_s']:.3f} s / {v['mean_ttft_s']:.3f} s")
    print("sessions (4 replicas at 4 req/s, 2,000 turns, vllm+prefix): prefix hit rate, mean / p99 TTFT")
    for (seed, router), v in sessions().items():
        print(f"  seed {seed} {router:<15} {v['prefix_hit_rate']:.1%}  {v['mean_ttft_s']:.3f} s / "
              f"{v['p99_ttft_s']:.3f} s")
    print("sessions opening with one shared 256-token system prompt (as above, seed 0): prefix hit rate, mean "
          "TTFT, load imbalance, requests per replica")
    for router, v in shared_system_prompt().items():
        print(f"  {router:<46} {v['prefix_hit_rate']:.1%}  {v['mean_ttft_s']:.3f} s  {v['load_imbalance']:.2f}  "
              f"{v['per_replica']}")
    print("mooncake-conversation (first 1,500 requests, own arrivals; 4 x Llama-3.1-8B on H100 SXM, 131,072-token "
          "context, vllm+prefix): prefix hit rate, mean / p99 TTFT, load imbalance")
    for router, v in mooncake().items():
        print(f"  {router:<46} {v['prefix_hit_rate']:.1%}  {v['mean_ttft_s']:.3f} s / {v['p99_ttft_s']:.3f} s  "
              f"{v['load_imbalance']:.2f}")


if __name__ == "__main__":
    main()
