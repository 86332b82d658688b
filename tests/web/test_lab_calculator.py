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
    page.fill("#calc-context", "999999999")  # refused in the page, in the server's words
    page.wait_for_selector("#calc-error:not([hidden])")
    assert "tokens each (context_len) 999999999 is out of range: 1 to 10000000" in page.inner_text("#calc-error")
    assert "stale" in page.get_attribute("#calculator", "class")  # the old figures are dimmed
    page.fill("#calc-context", "abc")
    page.wait_for_function("document.querySelector('#calc-error').textContent.includes('\"abc\" is not')")
    assert page.inner_text("#calc-error") == \
        'tokens each (context_len) "abc" is not a whole number: type one from 1 to 10000000'
    lab.screenshot("calculator-error", "#calculator")
    page.fill("#calc-context", "4000")  # longer than OPT-13B's 2,048: sizing's own message
    page.wait_for_function("document.querySelector('#calc-error').textContent.includes('exceeds max_model_len')")
    page.fill("#calc-context", "1000")
    page.wait_for_selector("#calc-error", state="hidden")
