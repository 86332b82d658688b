"""Fix 59 (trial 58, finding 1): the lab's calculator says how vLLM's "GPU KV cache size" is counted where it is not
the blocks times their tokens (a sliding window), and its bridge no longer divides those tokens by the block size."""

from __future__ import annotations


def test_calculator_relates_vllms_figure_to_the_token_slots(lab, kvlab):
    page = lab.page
    size = kvlab("size", "mistral-7b-v0.1", "--gpu", "H100-SXM", "--json").json()
    page.select_option("#calc-gpu", "H100-SXM")
    page.select_option("#calc-model", "mistral-7b-v0.1")
    page.wait_for_function("tokens => document.querySelector('#calc-figures [data-key=num_tokens]').dataset.value "
                           "=== tokens", arg=str(size["num_tokens"]))
    text = page.inner_text('#calc-figures [data-key="num_tokens"]')
    slots = size["num_blocks"] * size["block_size"]
    assert f"{size['num_tokens']:,} tokens (vLLM's startup figure, whole" in text, text
    assert f"not the {slots:,} token slots" in text
    page.wait_for_function("tokens => document.querySelector('#bridge-log').textContent.includes(tokens)",
                           arg=f"{size['num_tokens']:,}")
    bridge = page.inner_text('#bridge [data-field="bridge-blocks"]')
    assert f"{size['num_blocks']:,} blocks (the tokens are vLLM's startup figure" in bridge, bridge
    assert f"/ {size['block_size']} =" not in bridge


def test_a_body_that_is_not_json_is_said_so():
    """Trial 59, finding 14: `{bad json` was answered "must be a JSON object"."""
    from starlette.testclient import TestClient

    from kvlab.web.server import create_app

    with TestClient(create_app(allowed_hosts=["testserver"])) as client:
        r = client.post("/api/sessions", content=b"{bad json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "are not valid JSON" in r.json()["error"]
