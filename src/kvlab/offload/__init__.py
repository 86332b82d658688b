"""KV offload to CPU memory as vLLM's OffloadingConnector does it (docs/offload.md): every GPU block that fills is
stored to a CPU block pool of a given size (LRU), and a request being admitted loads the blocks it finds there beyond
its GPU prefix-cache hit, over the host link."""

from kvlab.offload.config import OffloadConfig, resolve_offload

__all__ = ["OffloadConfig", "resolve_offload"]
