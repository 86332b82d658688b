"""What routing does to a fleet, on the vLLM paper's setup (kvlab.fleet.experiments; docs/fleet.md prints the
numbers with `python -m kvlab.fleet.experiments`)."""

from __future__ import annotations

import pytest

from kvlab.fleet import experiments

# The family of tests on one fleet: 4 replicas' TTFTs (KS), their mean TPOTs (Welch). TTFTs within a run are
# correlated through the queue, which makes KS's p-values optimistic: a strict alpha for them.
TTFT_ALPHA = 1e-3
TPOT_ALPHA = 1e-2


@pytest.fixture(scope="module")
def split():
    return experiments.random_split()


def test_random_routing_gives_each_replica_the_load_of_one_at_r(split):
    """4 replicas behind random at 8 req/s (Poisson, seed 1) against lone replicas at 2 req/s (seeds 100-107):
    each replica's TTFTs pass a two-sample KS test against a lone run's at alpha 0.001, and the replicas' mean
    TPOTs a Welch t-test against the lone runs' at alpha 0.01."""
    assert sum(split["replica_num_requests"]) == 4 * 1500
    assert min(split["same"]["ttft_ks_p"]) > TTFT_ALPHA
    assert split["same"]["tpot_t_p"] > TPOT_ALPHA


def test_the_same_tests_see_a_lone_replica_at_a_quarter_more_load(split):
    """The control: against lone replicas at 2.5 req/s both tests reject, for every replica."""
    assert max(split["control"]["ttft_ks_p"]) < TTFT_ALPHA
    assert split["control"]["tpot_t_p"] < TPOT_ALPHA


def test_least_requests_has_a_lower_p99_ttft_than_round_robin_on_bursts():
    """Gamma arrivals with CV 3 at 10 req/s over 4 replicas (near their capacity): sending each request to the
    replica with the fewest requests keeps bursts from queueing behind long answers."""
    result = experiments.bursty()
    for seed in (0, 1):
        assert result[(seed, "least-requests")]["p99_ttft_s"] < result[(seed, "round-robin")]["p99_ttft_s"]


def test_prefix_routing_finds_the_conversation_cached_where_it_ran():
    """Multi-turn sessions at 4 req/s over 4 replicas with prefix caching: the prefix router sends each turn where
    the session's context is cached, so it hits more and its first tokens come sooner than round-robin's."""
    result = experiments.sessions()
    for seed in (0, 1):
        prefix, round_robin = result[(seed, "prefix")], result[(seed, "round-robin")]
        assert prefix["prefix_hit_rate"] > round_robin["prefix_hit_rate"]
        assert prefix["mean_ttft_s"] < round_robin["mean_ttft_s"]


def test_one_shared_system_prompt_pulls_prefix_routing_onto_one_replica_and_weighted_spreads_it():
    """Every session opens with one 256-token system prompt: the first replica to cache it holds the longest
    prefix of every new session, so the prefix router sends it everything; the weighted router, with load
    scorers beside prefix, spreads the sessions and hits more than round-robin."""
    result = experiments.shared_system_prompt()
    prefix, weighted = result["prefix"], result["weighted(prefix:2,least-kv:1,least-requests:1)"]
    assert prefix["per_replica"] == [2000, 0, 0, 0] and prefix["load_imbalance"] == pytest.approx(4.0)
    assert weighted["load_imbalance"] < 1.1
    assert weighted["prefix_hit_rate"] > result["round-robin"]["prefix_hit_rate"]
    assert weighted["mean_ttft_s"] < min(result["round-robin"]["mean_ttft_s"], prefix["mean_ttft_s"])
