"""The lab server's parameter checks: every bad value is named, with its valid range."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.web.params import LIMITS, parse_run_spec, parse_speed


def test_defaults_are_the_command_lines():
    """One source of truth: the lab's runs default to what `kvlab race` runs (kvlab.defaults)."""
    from kvlab import defaults
    from kvlab.config import resolve

    spec = parse_run_spec({"kind": "race"})
    assert spec.strategies == ("static+max", "continuous+max", "static+paged", "continuous+paged")
    assert (spec.num_requests, spec.rate, spec.block_size, spec.num_blocks) == (1000, 4.0, 16, None)
    assert (spec.model, spec.gpu, spec.workload, spec.seed) == (defaults.MODEL, defaults.GPU, defaults.WORKLOAD, 0)
    # The page's run and `kvlab race`'s are one configuration: one key.
    assert resolve(spec.options()).key == resolve().key
    # The grid tells the story: it opens on reserve-the-max.
    assert parse_run_spec({}).strategies == ("continuous+max",)


def test_form_strings_are_parsed():
    spec = parse_run_spec({"kind": "grid", "strategies": ["static+max"], "rate": "3.5", "num_requests": "40",
                           "block_size": "32", "num_blocks": "64", "seed": "7"})
    assert (spec.rate, spec.num_requests, spec.block_size, spec.num_blocks, spec.seed) == (3.5, 40, 32, 64, 7)
    assert parse_run_spec({"num_blocks": "auto"}).num_blocks is None


@pytest.mark.parametrize(
    "data, message",
    [
        ({"num_requests": 0}, "num_requests 0 is out of range: 1 to 2000"),
        ({"num_requests": LIMITS["max_num_requests"] + 1}, "num_requests 2001 is out of range: 1 to 2000"),
        ({"num_requests": "ten"}, "num_requests 'ten' is not a whole number; valid: an integer from 1 to 2000"),
        ({"num_requests": 2.5}, "num_requests 2.5 is not a whole number; valid: an integer from 1 to 2000"),
        ({"rate": -1}, "rate -1 is out of range: 0.01 to 100"),
        ({"rate": "nan"}, "rate 'nan' is out of range: 0.01 to 100"),
        ({"block_size": 24}, "block_size 24 is not one the lab offers (vLLM's CUDA block sizes): 16, 32, 64, 128"),
        ({"num_blocks": 1}, "num_blocks 1 is out of range: 4 to 65536"),
        ({"num_blocks": 10**6}, "num_blocks 1000000 is out of range: 4 to 65536"),
        ({"kind": "movie"}, "kind 'movie' is not one of: grid, race"),
        ({"kind": "grid", "strategies": ["static+max", "vllm"]}, "a grid runs one strategy, got 2"),
        ({"kind": "race", "strategies": ["vllm"] * 5}, "a race holds at most 4 strategies, got 5"),
        ({"bogus": 1}, "unknown parameter 'bogus'"),
        ({"seed": -3}, "seed -3 is out of range"),
        ({"model": "x" * 300}, "model must be a name of at most 200 characters"),
    ],
)
def test_bad_values_are_named(data, message):
    with pytest.raises(KvlabError) as info:
        parse_run_spec(data)
    assert message in str(info.value)


def test_not_an_object():
    with pytest.raises(KvlabError, match="must be a JSON object"):
        parse_run_spec([1, 2])


def test_speed():
    assert parse_speed(None) == 4.0
    assert parse_speed("10") == 10.0
    with pytest.raises(KvlabError, match="speed '1e9' is out of range: 0.01 to 1000"):
        parse_speed("1e9")


def test_a_race_refuses_a_strategy_given_twice_as_kvlab_race_does():
    with pytest.raises(KvlabError, match="strategy 'vllm' is given 2 times; .* valid: each name once"):
        parse_run_spec({"kind": "race", "strategies": ["vllm", "orca-max", "vllm"]})
    with pytest.raises(KvlabError, match="unknown strategy 'nope'"):
        parse_run_spec({"kind": "race", "strategies": ["vllm", "nope"]})
