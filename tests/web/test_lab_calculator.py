"""The lab page's calculator shows the numbers `kvlab size` prints."""

from __future__ import annotations

import pytest


def figure(page, key: str) -> str:
    return page.get_attribute(f'#calc-figures [data-key="{key}"]', "data-value")


@pytest.mark.parametrize("model, gpu", [("qwen3-32b", "H100-SXM"), ("opt-13b", "A100-40GB")])
def test_calculator_matches_kvlab_size(lab, kvlab, model, gpu):
    page = lab.page
    expected = kvlab("size", model, "--gpu", gpu, "--json").json()
    fit = kvlab("size", model, "--gpu", gpu, "--concurrency", "8", "--context-len", "1024", "--json").json()
    page.fill("#calc-concurrency", "8")
    page.fill("#calc-context", "1024")
    page.select_option("#calc-gpu", gpu)
    page.select_option("#calc-model", model)
    # Wait for the answer to these inputs (the first one on the page, for the defaults, may have the same tokens).
    page.wait_for_function(
        "([tokens, fit]) => document.querySelector('#calc-figures [data-key=num_tokens]').dataset.value === tokens"
        " && document.querySelector('#calc-figures [data-key=num_fit]').dataset.value === fit",
        arg=[str(expected["num_tokens"]), str(fit["workload"]["max_num_requests"])],
    )
    assert int(figure(page, "kv_bytes_per_token")) == expected["kv_bytes_per_token"]
    assert int(figure(page, "num_tokens")) == expected["num_tokens"]
    assert float(figure(page, "max_concurrency")) == expected["max_concurrency"]
    assert int(figure(page, "weights_bytes")) == expected["weights_bytes"]
    assert int(figure(page, "available_kv_bytes")) == expected["available_kv_bytes"]
    assert page.inner_text("#calc-log").splitlines() == expected["vllm_log_lines"]
    # The bar is the paper's Figure 1 split, byte for byte.
    split = expected["memory_split"]
    for part, key in (("weights", "weights_bytes"), ("kv", "kv_cache_bytes"), ("other", "other_bytes")):
        assert int(page.get_attribute(f'#calc-bar [data-part="{part}"]', "data-value")) == split[key]
    assert int(figure(page, "num_fit")) == fit["workload"]["max_num_requests"]
    lab.screenshot(f"calculator-{model}", "#calculator")


def test_calculator_refuses_bad_values_with_a_message(lab):
    page = lab.page
    page.fill("#calc-context", "99999999999")  # refused in the page, in the server's words (kvlab size's range)
    page.wait_for_selector("#calc-error:not([hidden])")
    assert "tokens each (context_len) 99999999999 is out of range: 1 to 17179869184" in page.inner_text("#calc-error")
    assert "stale" in page.get_attribute("#calculator", "class")  # the old figures are dimmed
    page.fill("#calc-context", "abc")
    page.wait_for_function("document.querySelector('#calc-error').textContent.includes('\"abc\" is not')")
    assert page.inner_text("#calc-error") == \
        'tokens each (context_len) "abc" is not a whole number: type one from 1 to 17179869184'
    lab.screenshot("calculator-error", "#calculator")
    page.fill("#calc-context", "4000")  # longer than OPT-13B's 2,048: sizing's own message
    page.wait_for_function("document.querySelector('#calc-error').textContent.includes('exceeds max_model_len')")
    page.fill("#calc-context", "1000")
    page.wait_for_selector("#calc-error", state="hidden")


def opacity(page, selector: str) -> float:
    return float(page.eval_on_selector(selector, "e => getComputedStyle(e).opacity"))


def test_a_changed_input_dims_the_figures_until_the_answer_arrives(lab):
    """From the moment an input changes until /api/size answers, the figures on show are the old question's: they
    are dimmed and "sizing…" stands beside the controls (they once stayed, state "ok", for seconds while the
    engine sized llama-3.1-405b). The answer is held back here by intercepting the request."""
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    assert opacity(page, "#calc-out") == 1 and not page.is_visible("#calc-pending")
    held = []
    asks = lambda url: "/api/size?" in url  # noqa: E731
    page.route(asks, lambda route: held.append(route))
    page.select_option("#calc-model", "llama-3.1-405b")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'pending'", timeout=5_000)
    page.wait_for_timeout(300)  # (the answer is held: the state stays)
    assert page.get_attribute("#calculator", "data-state") == "pending"
    assert "stale" in page.get_attribute("#calculator", "class")
    assert opacity(page, "#calc-out") < 0.5
    assert page.is_visible("#calc-pending") and page.inner_text("#calc-pending") == "sizing…"
    page.unroute(asks)
    for route in held:
        route.continue_()
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'refused'", timeout=30_000)
    assert not page.is_visible("#calc-pending") and page.is_visible("#calc-error")


@pytest.mark.parametrize("model, gpu", [("opt-13b", "A100-40GB"), ("qwen3-32b", "H100-SXM"), ("opt-13b", "A100-80GB")])
def test_the_bars_whole_shares_add_up_to_100(lab, model, gpu):
    """The bar's percentages are whole numbers that add up to 100 (they once read 61 + 27 + 13 = 101%)."""
    import re

    page = lab.page
    page.select_option("#calc-gpu", gpu)
    page.select_option("#calc-model", model)
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'", timeout=30_000)
    said = page.get_attribute("#calc-bar", "aria-label")
    shares = [int(x) for x in re.findall(r"(\d+)%", said)]
    assert len(shares) >= 2 and sum(shares) == 100, said


def test_section_10_follows_the_calculators_utilization(lab):
    """Section 10 reads the pool at the calculator's utilization (it kept showing 0.9's while the calculator was at
    0.3), names it in the command, and is dimmed while the calculator refuses the value."""
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    page.fill("#calc-util", "0.8")
    page.dispatch_event("#calc-util", "change")
    model, gpu = page.input_value("#calc-model"), page.input_value("#calc-gpu")
    want = page.evaluate("q => fetch('api/size?' + q, {headers: {'X-Kvlab-Refusals': 'in-body'}}).then(r => r.json())",
                         f"model={model}&gpu={gpu}&gpu_memory_utilization=0.8")
    page.wait_for_function("n => document.querySelector('[data-field=bridge-blocks]').dataset.value === String(n)",
                           arg=want["num_blocks"], timeout=30_000)
    assert page.inner_text('[data-field="bridge-cmd"]').endswith("--gpu-memory-utilization 0.8")
    assert page.get_attribute("#bridge-now", "data-stale") == ""
    page.fill("#calc-util", "7")
    page.dispatch_event("#calc-util", "change")
    page.wait_for_function("document.querySelector('#bridge-now').dataset.stale === '1'")
    assert page.is_disabled('[data-act="bridge-draw"]')


def test_calculator_says_when_vllm_would_refuse_to_start_beside_its_numbers(lab):
    """Trial 52 #4: llama-3.1-70b on a B200 showed 0.60x concurrency and nothing else, where `kvlab size` says vLLM
    would refuse to start (one 131,072-token request needs 8,192 blocks, 4,894 are usable). The numbers stay; the
    reason and what to change are said in the calculator's slot, and go when a GPU where it starts is picked."""
    page = lab.page
    page.select_option("#calc-gpu", "B200")
    page.select_option("#calc-model", "llama-3.1-70b")
    page.wait_for_function("document.querySelector('#calc-error').textContent.includes('vLLM would refuse to start')")
    said = page.inner_text("#calc-error")
    assert "one 131,072-token request needs 8,192 blocks but 4,894 are usable" in said and "--" not in said, said
    assert "Try: " in said and not page.is_hidden("#calc-out")
    page.select_option("#calc-model", "opt-13b")
    page.wait_for_selector("#calc-error", state="hidden")


def test_calculator_says_vllm_runs_at_most_max_num_seqs_at_once(lab):
    """Trial 55, finding 2: 5,000 requests of 128 tokens "fit" llama-3.2-1b's cache on an H200, but vLLM runs at most
    max_num_seqs of them at once; the fit line says so, with the count the server answered."""
    page = lab.page
    page.fill("#calc-concurrency", "5000")
    page.fill("#calc-context", "128")
    page.select_option("#calc-gpu", "H200")
    page.select_option("#calc-model", "llama-3.2-1b")
    page.wait_for_function("document.querySelector('#calc-figures [data-key=num_fit]').textContent"
                           ".includes('at once')", timeout=30_000)
    w = page.evaluate("() => fetch('api/size?model=llama-3.2-1b&gpu=H200&concurrency=5000&context_len=128')"
                      ".then(r => r.json())")["workload"]
    said = page.inner_text('#calc-figures [data-key="num_fit"]')
    assert said == (f"all 5,000 fit in the cache (it holds {w['num_fit']:,} of that length), but vLLM runs at most "
                    f"{w['max_num_seqs']:,} at once (max_num_seqs: vLLM's default here): the other "
                    f"{5000 - w['max_num_seqs']:,} wait"), said
