"""The CPU tier's size and link, in vLLM's names: ``--kv-offloading-size`` GiB (vllm/config/cache.py:
CacheConfig.kv_offloading_size, the buffer summed over the tensor-parallel ranks) through ``--kv-offloading-backend
native``, which becomes the OffloadingConnector with a CPU spec (vllm/v1/kv_offload/cpu.py: CPUOffloadingSpec,
``num_cpu_blocks`` = bytes / the bytes of one offloaded block, the GPU block size by default).

The GPU catalogue names each card's link between GPUs; a CPU tier is reached over the card's host link, PCIe for
every card here (an SXM card's NVLink joins GPUs, not the host). ``HOST`` gives that link and the CPU memory per GPU
of the reference server each card ships in (NVIDIA's DGX/HGX datasheets; a PCIe card: a typical 2-socket host of
8 cards), so an offload larger than the machine's memory is refused, and a swap space above vLLM's share of it
(check_swap_space); --cpu-memory-gib replaces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.errors import KvlabError

GIB = 2**30

# card -> (host link, bytes/s per direction, CPU memory GiB per GPU of its reference server)
HOST = {
    "T4": ("PCIe 3.0 x16", 16e9, 48),  # AWS g4dn.metal: 384 GiB over 8 T4
    "A10G": ("PCIe 4.0 x16", 32e9, 96),  # AWS g5.48xlarge: 768 GiB over 8 A10G
    "L4": ("PCIe 4.0 x16", 32e9, 96),  # AWS g6.48xlarge: 768 GiB over 8 L4
    "L40S": ("PCIe 4.0 x16", 32e9, 192),  # AWS g6e.48xlarge: 1,536 GiB over 8 L40S
    "A100-40GB": ("PCIe 4.0 x16", 32e9, 128),  # DGX A100: 1 TB over 8
    "A100-80GB": ("PCIe 4.0 x16", 32e9, 256),  # DGX A100 640GB: 2 TB over 8
    "H100-SXM": ("PCIe 5.0 x16", 64e9, 256),  # DGX H100: 2 TB over 8
    "H100-PCIe": ("PCIe 5.0 x16", 64e9, 256),
    "H200": ("PCIe 5.0 x16", 64e9, 256),  # DGX H200: 2 TB over 8
    "B200": ("PCIe 5.0 x16", 64e9, 512),  # DGX B200: 4 TB over 8
    "RTX-4090": ("PCIe 4.0 x16", 32e9, 64),
    "RTX-3090": ("PCIe 4.0 x16", 32e9, 64),
    "RTX-5090": ("PCIe 5.0 x16", 64e9, 64),
    "MI300X": ("PCIe 5.0 x16", 64e9, 256),  # AMD Instinct MI300X platform: 2 TB over 8
}


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """A CPU tier of ``num_cpu_blocks`` blocks of ``block_bytes`` (one GPU block's KV, every layer and GPU), reached
    over ``link`` at ``link_bandwidth_bytes_per_s``."""

    num_cpu_blocks: int
    block_bytes: int
    link: str
    link_bandwidth_bytes_per_s: float
    size_gib: float = 0.0  # --kv-offloading-size, as given
    cpu_memory_gib: float | None = None  # --cpu-memory-gib, when given

    def __post_init__(self) -> None:
        if self.num_cpu_blocks < 1:
            raise KvlabError(f"--kv-offloading-size holds {self.num_cpu_blocks} blocks of {self.block_bytes:,} "
                             "bytes; valid: a size of at least one block")

    def seconds(self, num_bytes: int) -> float:
        """Time to move ``num_bytes`` between GPU and CPU memory over the host link."""
        return link_seconds(num_bytes, self.link_bandwidth_bytes_per_s)


def kv_block_bytes(kv_bytes_per_token: int, block_size: int) -> int:
    """Bytes of one KV block, every layer and GPU (vLLM's page size times the layers): what a link moves per block,
    for the CPU tier here and for a disaggregated fleet's transfers (kvlab.disagg)."""
    return kv_bytes_per_token * block_size


def link_seconds(num_bytes: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time to move ``num_bytes`` over a link of ``bytes_per_s`` a direction that takes ``latency_s`` to start."""
    return latency_s + num_bytes / bytes_per_s


def machine_cpu_memory(gpu: str, num_gpus: int, cpu_memory_gib: float | None = None) -> tuple[float, str]:
    """The CPU memory in GiB of the machine ``num_gpus`` of ``gpu`` sit in, and where the figure comes from:
    --cpu-memory-gib when given, else the card's reference server (HOST)."""
    if cpu_memory_gib is not None:
        return cpu_memory_gib, "--cpu-memory-gib"
    return _host(gpu)[2] * num_gpus, f"{num_gpus} x {gpu}'s reference server"


def _host(gpu: str) -> tuple[str, float, int]:
    return HOST.get(gpu, ("PCIe 4.0 x16", 32e9, 64))


# vLLM refuses a swap space (--swap-space GiB per GPU, times the tensor-parallel GPUs it takes to share one node)
# above 70% of the host's CPU memory, "Too large swap space", and warns above 40% (CacheConfig.
# verify_with_parallel_config: vllm/config/cache.py, vllm/config.py before that file was split).
SWAP_SHARE_REFUSED = 0.7


def check_swap_space(swap_space_gib: float, tensor_parallel_size: int, gpu: str, num_gpus: int,
                     cpu_memory_gib: float | None = None, offload_gib: float = 0.0) -> None:
    """Refuse, as vLLM does, a swap space of ``swap_space_gib`` per GPU that takes more than SWAP_SHARE_REFUSED of
    the machine's CPU memory (machine_cpu_memory) over the tensor-parallel GPUs; and one that does not fit beside
    a CPU tier of ``offload_gib`` (--kv-offloading-size): both are pinned CPU memory of the one machine."""
    total, source = machine_cpu_memory(gpu, num_gpus, cpu_memory_gib)
    used = swap_space_gib * tensor_parallel_size
    if offload_gib and round(used + offload_gib, 6) > round(total, 6):
        each = "" if tensor_parallel_size == 1 else f" x {tensor_parallel_size} GPUs (TP)"
        raise KvlabError(f"--swap-space {swap_space_gib:g} GiB{each} and --kv-offloading-size {offload_gib:g} GiB "
                         f"take {used + offload_gib:g} GiB of CPU memory together, more than the machine's {total:g} "
                         f"GiB ({source}); valid: a swap space and a CPU tier of at most {total:g} GiB together, or "
                         f"--cpu-memory-gib at least {used + offload_gib:g}")
    if round(used, 6) <= round(SWAP_SHARE_REFUSED * total, 6):  # (in GiB to the KiB: 0.7 x 16 is 11.2)
        return
    each = "" if tensor_parallel_size == 1 else f" per GPU x {tensor_parallel_size} GPUs (TP) = {used:g} GiB"
    most = math.floor(SWAP_SHARE_REFUSED * total / tensor_parallel_size * 10 + 1e-6) / 10
    least = math.ceil(used / SWAP_SHARE_REFUSED * 10 - 1e-6) / 10
    raise KvlabError(f"--swap-space {swap_space_gib:g} GiB{each} is more than {SWAP_SHARE_REFUSED:.0%} of the "
                     f"machine's CPU memory ({total:g} GiB, {source}), a swap space vLLM refuses as too large; valid: "
                     f"--swap-space at most {most:g}, or --cpu-memory-gib at least {least:g}")


def resolve_offload(size_gib: float | None, gpu: str, num_gpus: int, block_size: int, kv_bytes_per_token: int,
                    cpu_memory_gib: float | None = None) -> OffloadConfig | None:
    """The CPU tier ``--kv-offloading-size size_gib`` gives on ``num_gpus`` of ``gpu`` (None: off)."""
    if not size_gib:
        return None
    link, bandwidth, _ = _host(gpu)
    limit, source = machine_cpu_memory(gpu, num_gpus, cpu_memory_gib)
    if size_gib > limit:
        raise KvlabError(f"--kv-offloading-size {size_gib:g} GiB is more than the machine's CPU memory ({limit:g} GiB, "
                         f"{source}); valid: at most {limit:g} GiB, or "
                         f"{'a larger' if cpu_memory_gib is not None else 'give'} --cpu-memory-gib")
    block_bytes = kv_block_bytes(kv_bytes_per_token, block_size)
    if block_bytes <= 0:
        raise KvlabError("--kv-offloading-size needs the model's KV bytes per token: give a catalogue model")
    if int(size_gib * GIB) < block_bytes:  # (in GiB, as given: a block's bytes rounded up to what holds one)
        least = math.ceil(block_bytes / GIB * 1e4) / 1e4
        raise KvlabError(f"--kv-offloading-size {size_gib:g} GiB holds no KV block ({block_bytes / 2**20:g} MiB "
                         f"each); valid: at least {least:g} GiB, one block")
    return OffloadConfig(num_cpu_blocks=int(size_gib * GIB) // block_bytes, block_bytes=block_bytes, link=link,
                         link_bandwidth_bytes_per_s=bandwidth, size_gib=size_gib, cpu_memory_gib=cpu_memory_gib)
