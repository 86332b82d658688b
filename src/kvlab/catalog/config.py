"""Models from a config.json: a local file, a folder holding one, or a Hugging Face id (fetched, then cached).

Multimodal checkpoints keep the language model's numbers under ``text_config``; kvlab sizes that part, as
vLLM's ``hf_text_config`` does.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

from kvlab.catalog.models import ModelSpec, check_integer_fields, spec_from_fields
from kvlab.errors import KvlabError

HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Fields a nested text_config inherits from the top level when it does not set them itself.
INHERITED = ("torch_dtype", "dtype", "tie_word_embeddings", "quantization_config", "architectures")
ROUTES = ("use a model from the catalogue (`kvlab models`), or give a local config.json or a folder "
          "holding one")


def looks_like_path(name: str) -> bool:
    return (os.path.exists(name) or name.endswith(".json") or name.startswith((".", "/", "~"))
            or os.sep in name and not HF_ID.fullmatch(name))


def looks_like_hf_id(name: str) -> bool:
    return bool(HF_ID.fullmatch(name))


def text_fields(config: dict) -> dict:
    """The language model's fields: ``text_config`` when the checkpoint nests one, else the top level."""
    nested = config.get("text_config")
    if isinstance(nested, dict) and (nested.get("num_hidden_layers") is not None
                                     or config.get("num_hidden_layers") is None):
        merged = dict(nested)
        for key in INHERITED:
            if merged.get(key) is None and config.get(key) is not None:
                merged[key] = config[key]
        return merged
    return config


def spec_from_config(config: dict, *, id: str, where: str, origin: str, hf_repo: str | None = None) -> ModelSpec:
    if not isinstance(config, dict):
        raise KvlabError(f"{where}: expected a JSON object, got {type(config).__name__}")
    check_integer_fields(config, where)
    from dataclasses import replace

    from kvlab.catalog.vision import gemma4_video, load_buffers, ple_staging, towers_whole, vision_params, vision_tower

    spec = spec_from_fields(text_fields(config), id=id, where=where, origin=origin, hf_repo=hf_repo, source=(where,))
    params, how = vision_params(config)
    if not how:
        return spec
    return replace(spec, vision_params=params, vision_source=how, vision_tower=vision_tower(config),
                   load_buffers=load_buffers(config), ple_staging=ple_staging(config),
                   vision_whole=towers_whole(config), gemma4_video=gemma4_video(config))


def load_config_path(path: str) -> ModelSpec:
    """A model from a local config.json, or a folder that holds one."""
    p = Path(path).expanduser()
    if p.is_dir():
        folder, p = p, p / "config.json"
        if not p.is_file():
            raise KvlabError(f"folder {str(folder)!r} holds no config.json; {ROUTES}")
    elif p.exists():
        if not p.is_file():
            raise KvlabError(f"{path!r} is not a regular file or folder (a device, pipe or socket); {ROUTES}")
    else:
        raise KvlabError(f"no such file {path!r}; {ROUTES}")
    try:
        raw = p.read_text(encoding="utf-8")
        if not raw.strip():
            raise KvlabError(f"{str(p)!r} is empty: give a model's config.json (its Hugging Face config); {ROUTES}")
        config = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvlabError(f"cannot read {str(p)!r} as JSON: {exc}") from None
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return spec_from_config(config, id=name or str(p), where=str(p), origin="config.json")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub answers at all. Checked first because huggingface_hub retries an unreachable host with
    back-off for about half a minute before giving up; offline, kvlab goes straight to the local cache."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides; let huggingface_hub try
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


@cache
def load_hf_model(repo_id: str) -> ModelSpec:
    """A model from ``config.json`` on the Hugging Face Hub (huggingface_hub keeps its own disk cache)."""
    online = hub_reachable()
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo_id, "config.json", local_files_only=not online)
    except Exception as exc:  # offline, unknown repo, gated repo, network error: all the same to the user
        if online:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = f"its config.json could not be fetched from Hugging Face ({type(exc).__name__}: {reason[:160]})"
        else:
            why = "Hugging Face is unreachable (offline) and its config.json is not in the local Hugging Face cache"
        raise KvlabError(f"model {repo_id!r} is not in the catalogue and {why}; {ROUTES}") from None
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    return spec_from_config(config, id=repo_id.split("/")[-1].lower(), where=f"huggingface {repo_id} config.json",
                            origin="huggingface", hf_repo=repo_id)
