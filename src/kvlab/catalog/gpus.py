"""GPUs as frozen specs: memory, bandwidth and peak FLOP/s, each with its source (data/gpus.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from kvlab.catalog.models import name_key
from kvlab.errors import KvlabError

GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    ``memory_bytes`` is what vLLM sees as total memory where a CUDA-reported figure was observed
    (``memory_bytes_source`` says which figure was used). ``peak_flops`` is dense tensor-core bf16
    (fp16 where the part has none; ``peak_flops_kind`` says which); bandwidth and FLOP/s may be None
    where no source was found.
    """

    id: str
    memory_bytes: int
    memory_bytes_source: str
    memory_bandwidth_bytes_per_s: int | None
    peak_flops: int | None
    peak_flops_kind: str | None = None
    memory_gb_marketing: float | None = None
    memory_type: str | None = None
    # The path a tensor-parallel all-reduce takes between two GPUs (NVLink, else PCIe) and its bytes/s per direction.
    link: str | None = None
    link_bandwidth_bytes_per_s: int | None = None
    peak_flops_fp8: int | None = None  # dense FP8 tensor FLOP/s, where the part has FP8
    aliases: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    source: tuple[str, ...] = field(default=(), compare=False)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


# CUDA compute capability of each catalogue GPU (NVIDIA's "CUDA GPUs" table, developer.nvidia.com/cuda-gpus): it
# decides which kernels vLLM picks for a quantized format, and with them how the weights are laid out (FP8 tensor
# cores from 8.9, vLLM's MXFP4 MoE kernels without Marlin from 9.0, FP4 tensor cores from 10.0). None: not NVIDIA.
COMPUTE_CAPABILITY = {"T4": 7.5, "A10G": 8.6, "L4": 8.9, "L40S": 8.9, "A100-40GB": 8.0, "A100-80GB": 8.0,
                      "H100-SXM": 9.0, "H100-PCIe": 9.0, "H200": 9.0, "B200": 10.0, "RTX-4090": 8.9, "MI300X": None,
                      "RTX-3090": 8.6, "RTX-5090": 12.0, "RTX-PRO-6000-Server": 12.0, "RTX-A4000": 8.6,
                      "RTX-3050-6GB": 8.6}


# GPUs whose memory is unified with the CPU's (an integrated GPU to CUDA). Two of vLLM's rules change there:
# - NVML reports no memory (nvmlDeviceGetMemoryInfo answers "Not Supported"), and vLLM asks NVML for the total when
#   it picks its batch defaults (platforms/cuda.py get_device_total_memory), so EngineArgs.get_batch_defaults falls back
#   to "device_memory = 0": the small-GPU defaults (vLLM 0.9 to 0.32). All five GB10 logs of the corpus (0.11 and 0.13)
#   print max_num_batched_tokens=2048 unasked, and the 0.11 one captures decode graphs up to 256 sequences.
# - vLLM's memory snapshots take the free memory from psutil.virtual_memory().available, not cudaMemGetInfo
#   (utils/mem_utils.py MemorySnapshot.measure: SM 8.7, 11.0 and 12.1 in the 0.13-era code, is_integrated_gpu in 0.32),
#   so the non-torch increase vLLM deducts counts whatever host memory the machine takes during startup.
UNIFIED_MEMORY_GPUS = ("GB10",)


def card_id(gpu_name: str | None) -> str:
    """The catalogue id in a GPU label: a --gpu-memory-gib label keeps it in front ('A100-40GB with 20 GiB')."""
    return (gpu_name or "").split(" with ")[0]


def is_unified_memory(gpu_name: str | None) -> bool:
    """A catalogue GPU that shares the CPU's memory (a --gpu-memory-gib label keeps the id in front)."""
    return card_id(gpu_name) in UNIFIED_MEMORY_GPUS


def compute_capability(gpu_name: str | None) -> float | None:
    """The compute capability of a catalogue GPU by its id (a --gpu-memory-gib label keeps the id in front)."""
    return COMPUTE_CAPABILITY.get(card_id(gpu_name))


@cache
def _catalogue() -> dict:
    return json.loads(resources.files("kvlab.catalog").joinpath("data/gpus.json").read_text(encoding="utf-8"))


@cache
def ambiguous_aliases() -> dict[str, tuple[str, ...]]:
    """Names that fit more than one card (``h100``: the SXM and the PCIe card both carry 80 GB), each with the cards
    it could mean: such a name is refused, never silently read as one of them."""
    return {name: tuple(ids) for name, ids in _catalogue()["ambiguous_aliases"].items() if not name.startswith("_")}


@cache
def list_gpus() -> tuple[GpuSpec, ...]:
    from kvlab.validate import gpu_entry

    specs = []
    for raw in _catalogue()["gpus"]:
        g = gpu_entry(raw)
        specs.append(GpuSpec(id=g.id, memory_bytes=g.memory_bytes, memory_bytes_source=g.memory_bytes_source,
                             memory_bandwidth_bytes_per_s=g.memory_bandwidth_bytes_per_s, peak_flops=g.peak_flops,
                             peak_flops_kind=g.peak_flops_kind, memory_gb_marketing=g.memory_gb_marketing,
                             memory_type=g.memory_type, link=g.link,
                             link_bandwidth_bytes_per_s=g.link_bandwidth_bytes_per_s, peak_flops_fp8=g.peak_flops_fp8,
                             aliases=tuple(g.aliases), notes=tuple(g.notes),
                             source=tuple(g.source)))
    return tuple(specs)


@cache
def _gpu_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in list_gpus():
        for name in (gpu.id, *gpu.aliases):
            index.setdefault(name_key(name), gpu)
    return index


def catalogued(card: str) -> bool:
    """Whether ``card`` (an ambiguous name's card: ambiguous_aliases) is one of the catalogue's GPUs."""
    return name_key(card) in _gpu_index()


def get_gpu(name: str, otherwise: str = "; or give the memory with --gpu-memory-gib") -> GpuSpec:
    """A GPU by forgiving name ('a100-40gb', 'A100_40GB', 'nvidia h100'); suggests close names on a miss, and
    ``otherwise``: what the caller's face offers instead of a catalogue GPU."""
    import difflib

    key = name_key(name)
    both = {name_key(a): ids for a, ids in ambiguous_aliases().items()}.get(key) or {
        name_key(a): ids for a, ids in ambiguous_aliases().items()}.get(key.removeprefix("nvidia"))
    if both is not None:  # (a card the catalogue lacks is named as such: its memory is given by --gpu-memory-gib)
        cards = [card if catalogued(card) else f"{card} (not in the catalogue: give its memory with --gpu-memory-gib)"
                 for card in both]
        raise KvlabError(f"GPU name {name!r} fits {len(both)} cards: {' and '.join(cards)}; name one of them "
                         f"(--gpu {both[0].lower()})")
    gpu = _gpu_index().get(key) or _gpu_index().get(key.removeprefix("nvidia"))
    if gpu is not None:
        return gpu
    names = [g.id for g in list_gpus()]
    lowered = {n.lower(): n for n in names}
    hits = [lowered[h] for h in difflib.get_close_matches(name.strip().lower(), list(lowered), n=3, cutoff=0.4)]
    hint = f" Did you mean: {', '.join(hits)}?" if hits else ""
    raise KvlabError(f"unknown GPU {name!r}.{hint} Known GPUs: {', '.join(names)}{otherwise}.")


def marketing_label_warning(gpu: GpuSpec) -> str | None:
    """For a card whose total is its marketing label read as GiB (no CUDA-reported total known), one line on how far
    that may overstate: the range by which the label exceeds CUDA's total on the catalogue's cards of the same memory
    kind (HBM or not) where both are known. None for a card with a CUDA-reported total."""
    if gpu.memory_bytes_source != "marketing_label":
        return None
    hbm = "HBM" in (gpu.memory_type or "")
    gaps = sorted(g.memory_gb_marketing * GIB / g.memory_bytes - 1 for g in list_gpus()
                  if g.id != gpu.id and g.memory_bytes_source.startswith("cuda") and g.memory_gb_marketing
                  and ("HBM" in (g.memory_type or "")) == hbm)
    if not gaps:
        return None
    most = gpu.memory_gib - gpu.memory_gib / (1 + gaps[-1])
    kind = "HBM" if hbm else "non-HBM"
    return (f"{gpu.id}'s {gpu.memory_gib:g} GiB is its marketing label read as GiB (no CUDA-reported total known); "
            f"CUDA reports {gaps[0]:.1%} to {gaps[-1]:.1%} less than the label on the catalogue's other {kind} cards, "
            f"so the total may be up to {most:.1f} GiB too high, and the KV cache budget with it")
