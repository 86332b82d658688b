"""Models and GPUs as data with their sources, and the config.json reader.

``get_model(name_or_path)`` takes a catalogue name (forgiving: 'opt-13b', 'OPT-13B', 'facebook/opt-13b'),
a local config.json or folder, or a Hugging Face id; ``get_gpu(name)`` a GPU name.
"""

from kvlab.catalog.gpus import GpuSpec, get_gpu, list_gpus
from kvlab.catalog.lookup import get_model
from kvlab.catalog.models import ModelSpec, list_models

__all__ = ["GpuSpec", "ModelSpec", "get_gpu", "get_model", "list_gpus", "list_models"]
