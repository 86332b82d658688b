"""Trial 55's findings 5, 2 and 6 on `kvlab size` and `kvlab fit`: the accuracy clause leads with the held-out score,
the most requests the KV cache holds is said beside vLLM's max_num_seqs, and fit's 'none' exits 2 as its help says."""

from __future__ import annotations


def _words(result) -> str:
    return " ".join(result.stdout.split())


def test_the_stored_halves_add_up_to_every_sized_log():
    """The held-out and fitted-on halves sizing_accuracy.json stores partition the sized logs it counts."""
    from kvlab.catalog.accuracy import kv_token_accuracy

    acc = kv_token_accuracy()
    assert acc["held_out_num_sized"] + acc["fit_num_sized"] == acc["num_sized"]
    assert acc["held_out_num_within"] + acc["fit_num_within"] == acc["num_within"]
    assert 0 < acc["held_out_num_within"] <= acc["held_out_num_sized"] < acc["num_sized"]


def test_size_and_fit_lead_with_the_held_out_score_and_name_the_fitted_on_one(kvlab):
    """Finding 5: '27 of 44 within 2%' counted the logs the estimate was fitted on, and was the only score given."""
    from kvlab.catalog.accuracy import kv_token_accuracy

    acc = kv_token_accuracy()
    held = f"on {acc['held_out_num_within']} of {acc['held_out_num_sized']} held-out startup logs"
    every = f"({acc['num_within']} of {acc['num_sized']} with the {acc['fit_num_sized']} it was fitted on;"
    for command in ("size", "fit"):
        r = kvlab(command, "qwen3-14b", "--gpu", "l40s")
        assert r.exit_code == 0, r.stderr
        words = _words(r)
        assert held in words and every in words, words
        assert words.index(held) < words.index(every)  # (the held-out score first)
        assert "real startup logs" not in words


def test_fit_says_vllm_runs_at_most_max_num_seqs_beside_what_the_cache_holds(kvlab):
    """Finding 2: 'Most concurrent requests at 128 tokens: 31,096' and 'fits' for 5,000, where vLLM runs 1,024."""
    args = ("fit", "llama-3.2-1b", "--gpu", "h200", "--context-len", "128", "--concurrency", "5000")
    data = kvlab(*args, "--json").json()
    cap, most = data["max_num_seqs"]["max_num_seqs"], data["max_num_requests"]["num_requests"]
    assert data["max_num_seqs"]["source"] == "vLLM's default"
    assert cap == kvlab("size", "llama-3.2-1b", "--gpu", "h200", "--json").json()["max_num_seqs"] < 5000 < most
    workload = data["workload"]
    assert workload["fits"] and workload["max_num_seqs"] == cap and workload["num_running_at_once"] == cap
    # (the KV arithmetic is the cache's, unchanged: the blocks needed, and the requests the usable blocks hold)
    assert workload["max_num_requests"] == workload["num_usable_blocks"] // workload["blocks_per_request"] == most
    words = _words(kvlab(*args))
    at_once = f"vLLM runs at most {cap:,} at once (max_num_seqs: vLLM's default here)"
    assert f"Most concurrent requests at 128 tokens: {most:,} fit in the KV cache; {at_once}" in words
    assert f"Longest context for 5,000 concurrent requests: {data['max_context_len']['context_len']:,} tokens; " \
           f"{at_once}" in words
    assert f"; but {at_once}: the other {5000 - cap:,} wait in its queue" in words


def test_a_given_max_num_seqs_is_named_and_a_workload_under_it_says_nothing_of_it(kvlab):
    args = ("size", "llama-3.2-1b", "--gpu", "h200", "--context-len", "128", "--concurrency")
    words = _words(kvlab(*args, "5000", "--max-num-seqs", "256"))
    assert "fits in the KV cache" in words
    assert "but vLLM runs at most 256 at once (--max-num-seqs 256): the other 4,744 wait in its queue" in words
    assert kvlab(*args, "5000", "--max-num-seqs", "256", "--json").json()["workload"]["num_running_at_once"] == 256
    under = _words(kvlab(*args, "200", "--max-num-seqs", "256"))
    assert "though vLLM runs at most 256 at once (--max-num-seqs 256)" in under and "queue" not in under
    # (a cache that holds fewer than max_num_seqs: nothing to say of it)
    small = kvlab("fit", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "8192", "--context-len", "8192",
                  "--concurrency", "2")
    assert small.exit_code == 0, small.stderr
    assert "max_num_seqs" not in small.stdout and "at once" not in small.stdout.replace("requests at once", "")


def test_fit_exits_2_with_one_line_where_not_one_token_each_fits_as_its_help_says(kvlab):
    """Finding 6: `fit llama-3.1-8b --gpu h100-sxm --concurrency 100000` printed 'none' and exited 0."""
    help_words = " ".join(kvlab("fit", "--help").stdout.split())
    assert "Exit status 2 too where not one token each fits --concurrency requests" in help_words
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "100000")
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    one = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "100000", "--context-len", "1",
                "--json").json()["max_context_len"]["max_num_requests_of_one_token"]
    assert "--concurrency 100,000: not even one token each fits" in r.stderr and f"valid: up to {one:,} requests" \
        in r.stderr and "Traceback" not in r.stderr
    assert kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "100000", "--json").exit_code == 2
    # (the most that do fit one token each is answered: exit 0)
    assert kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", str(one)).exit_code == 0
