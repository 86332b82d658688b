"""A model by any name a user gives: the catalogue (forgiving), a local config.json or folder, a Hugging Face id."""

from __future__ import annotations

from kvlab.catalog import config
from kvlab.catalog.models import ModelSpec, closest_model_names, find_catalogue_model
from kvlab.errors import KvlabError


def get_model(name_or_path: str) -> ModelSpec:
    """A model from the catalogue (forgiving name), a local config.json or folder, or a Hugging Face id."""
    if config.looks_like_path(name_or_path):
        return config.load_config_path(name_or_path)
    spec = find_catalogue_model(name_or_path)
    if spec is not None:
        return spec
    if config.looks_like_hf_id(name_or_path):
        return config.load_hf_model(name_or_path)
    suggestions = closest_model_names(name_or_path)
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    raise KvlabError(f"unknown model {name_or_path!r}.{hint} See `kvlab models` for the catalogue, or give a "
                     "config.json (or a folder holding one) or a Hugging Face id such as Qwen/Qwen3-8B.")
