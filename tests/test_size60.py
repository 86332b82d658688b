"""Issue 30 (size60): vLLM's default gpu_memory_utilization is the version's: 0.9 up to 0.19.1, 0.92 from 0.20.0
(vllm/config/cache.py in the source archives of those releases; kvlab.vllm_rules.default_gpu_memory_utilization)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.errors import KvlabError
from kvlab.vllm_rules import NEWEST_KNOWN, default_gpu_memory_utilization, version_key

INDEX = Path(__file__).parent / "data" / "startup_logs" / "index.json"


@pytest.mark.parametrize(("version", "share"), [
    ("0.9.2", 0.9), ("0.15.1", 0.9), ("0.19.1", 0.9), ("0.19", 0.9),
    ("0.20.0", 0.92), ("0.20.1rc1.dev16+g7a1eb8ac2", 0.92), ("0.24", 0.92), ("0.28.0", 0.92), (NEWEST_KNOWN, 0.92),
    (None, 0.92),  # the newest kvlab knows
])
def test_the_default_utilization_is_the_versions(version, share):
    assert default_gpu_memory_utilization(version) == share


def test_a_version_kvlab_does_not_know_is_refused_naming_the_known_ones():
    with pytest.raises(KvlabError, match=r"vLLM version '0\.8\.2' is not one kvlab knows.*valid: 0\.9\.0 to"):
        default_gpu_memory_utilization("0.8.2")


def _version(entry: dict) -> str | None:
    for key in ("vllm_rules_version", "vllm_version"):
        try:
            version_key(str(entry.get(key)))
        except KvlabError:
            continue
        return str(entry[key])
    return None


def test_corpus_entries_at_the_default_record_their_versions_default():
    """An entry whose utilization came from vLLM's default (settings_from says so) records its version's: 0.24.0,
    0.28.0 and the 0.22.0 nightlies were recorded at 0.9 before issue 30; a 0.8 build defaults to 0.9 too."""
    checked = []
    for entry in json.loads(INDEX.read_text(encoding="utf-8")):
        said = str((entry.get("settings_from") or {}).get("gpu_memory_utilization") or "")
        version = _version(entry)
        if not said.lower().startswith(("default", "vllm's default")) or version is None:
            continue
        expected = default_gpu_memory_utilization(version) if version_key(version) >= (0, 9, 0) else 0.9
        assert entry["gpu_memory_utilization"] == expected, entry["id"]
        checked.append(entry["id"])
    assert {"qwen3-14b-l40s-0.28.0", "qwen3.6-35b-a3b-nvfp4-rtx5090-0.24.0",
            "qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp", "qwen3-8b-a100-40gb-0.9.2"} <= set(checked)


def test_size_says_when_kvlab_s_utilization_is_not_the_versions(kvlab):
    """The trial: `kvlab size opt-13b --gpu a100-40gb` said what 'vLLM 0.32.0 would print' at 0.9, where 0.32.0
    defaults to 0.92 (14,864 tokens, not 13,824). kvlab keeps 0.9 unless told and says so, with the flag to pass."""
    note = ("at gpu_memory_utilization 0.9, kvlab's default, where vLLM 0.32.0 defaults to 0.92: pass "
            "--gpu-memory-utilization 0.92 for what it starts with unless told")
    said = " ".join(kvlab("size", "opt-13b", "--gpu", "a100-40gb").stdout.split())
    assert note in said and "GPU KV cache size: 13,824 tokens" in said
    told = " ".join(kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--gpu-memory-utilization", "0.92").stdout.split())
    assert "kvlab's default" not in told and "GPU KV cache size: 14,864 tokens" in told
    for quiet in (("--gpu-memory-utilization", "0.9"), ("--vllm-version", "0.19.1"), ("--available-kv-gib", "12")):
        assert "kvlab's default" not in kvlab("size", "opt-13b", "--gpu", "a100-40gb", *quiet).stdout, quiet
