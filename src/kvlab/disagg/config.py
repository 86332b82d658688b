"""A disaggregated fleet's shape and link (xPyD): x prefill replicas, y decode replicas, and the link the KV cache
crosses between them.

The link is the GPU catalogue's (``GpuSpec.link``: NVLink between the GPUs of one server, PCIe where a card has no
NVLink), as vLLM's NixlConnector moves KV over the fastest path UCX finds between the two instances; a fleet spread
over servers crosses the network instead: give its bandwidth (--kv-transfer-bandwidth) and latency
(--kv-transfer-latency). The catalogue has no latency figure, so it is 0 unless given. A transfer's bytes are the
prompt's blocks on the prefill replica (kvlab.offload.config.kv_block_bytes each, the model's KV layout) and its
time ``link_seconds`` (kvlab.offload.config), the same arithmetic as the CPU tier's loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.offload.config import kv_block_bytes, link_seconds


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """``num_prefill_replicas`` engines that compute prompts, ``num_decode_replicas`` that generate the answers, KV
    blocks of ``block_bytes`` moved between them over ``link`` at ``link_bandwidth_bytes_per_s`` a direction after
    ``link_latency_s``. ``bandwidth_given`` / ``latency_given``: the options as given (None: the catalogue's)."""

    num_prefill_replicas: int
    num_decode_replicas: int
    block_bytes: int
    link: str
    link_bandwidth_bytes_per_s: float
    link_latency_s: float = 0.0
    bandwidth_given: float | None = None
    latency_given: float | None = None

    def __post_init__(self) -> None:
        for flag, count in (("--prefill-replicas", self.num_prefill_replicas),
                            ("--decode-replicas", self.num_decode_replicas)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise KvlabError(f"{flag} {count!r}: a disaggregated fleet (xPyD) needs at least one prefill and one "
                                 "decode replica; valid: --prefill-replicas 1 or more with --decode-replicas 1 or "
                                 "more")
        if not self.link_bandwidth_bytes_per_s > 0:
            raise KvlabError(f"--kv-transfer-bandwidth {self.link_bandwidth_bytes_per_s / 1e9:g} GB/s: valid: more "
                             "than 0")
        if self.link_latency_s < 0:
            raise KvlabError(f"--kv-transfer-latency {self.link_latency_s:g} s: valid: 0 or more seconds")
        if self.block_bytes <= 0:
            raise KvlabError("a disaggregated fleet needs the model's KV bytes per token: give a catalogue model")

    @property
    def num_replicas(self) -> int:
        return self.num_prefill_replicas + self.num_decode_replicas

    @property
    def name(self) -> str:
        """vLLM's and the papers' spelling: 1P1D, 2P3D."""
        return f"{self.num_prefill_replicas}P{self.num_decode_replicas}D"

    def transfer_seconds(self, num_blocks: int) -> float:
        """Time for ``num_blocks`` KV blocks to cross the link."""
        return link_seconds(num_blocks * self.block_bytes, self.link_bandwidth_bytes_per_s, self.link_latency_s)


def resolve_disagg(prefill: int | None, decode: int | None, *, replicas: int, gpu, block_size: int,
                   kv_bytes_per_token: int, bandwidth_gb_s: float | None = None,
                   latency_s: float | None = None) -> DisaggConfig | None:
    """The fleet --prefill-replicas and --decode-replicas describe on ``gpu`` (a GpuSpec); None when neither is
    given (and neither link option is)."""
    if prefill is None and decode is None:
        for flag, value in (("--kv-transfer-bandwidth", bandwidth_gb_s), ("--kv-transfer-latency", latency_s)):
            if value is not None:
                raise KvlabError(f"{flag} {value:g} needs a disaggregated fleet: give --prefill-replicas and "
                                 "--decode-replicas")
        return None
    for flag, value, other, given in (("--prefill-replicas", prefill, "--decode-replicas", decode),
                                      ("--decode-replicas", decode, "--prefill-replicas", prefill)):
        if value is None:
            raise KvlabError(f"{other} {given} without {flag}: a disaggregated fleet (xPyD) needs at least one prefill "
                             "and one decode replica; valid: --prefill-replicas 1 or more with --decode-replicas 1 or "
                             "more")
    if replicas != 1:
        raise KvlabError(f"--replicas {replicas} with --prefill-replicas / --decode-replicas: a disaggregated fleet "
                         "counts its replicas by side; valid: --replicas 1 (its default)")
    link = gpu.link or "the GPUs' link"
    if bandwidth_gb_s is not None:
        link, bandwidth = "given", bandwidth_gb_s * 1e9
    elif gpu.link_bandwidth_bytes_per_s:
        bandwidth = float(gpu.link_bandwidth_bytes_per_s)
    else:
        raise KvlabError(f"{gpu.id} has no link bandwidth in the catalogue: give --kv-transfer-bandwidth GB/s")
    assert prefill is not None and decode is not None
    return DisaggConfig(num_prefill_replicas=prefill, num_decode_replicas=decode,
                        block_bytes=kv_block_bytes(kv_bytes_per_token, block_size), link=link,
                        link_bandwidth_bytes_per_s=bandwidth, link_latency_s=latency_s or 0.0,
                        bandwidth_given=bandwidth_gb_s, latency_given=latency_s)


def disagg_options(disagg: DisaggConfig | None) -> dict:
    """The options a disaggregated fleet came from (none when off: stored configurations' keys stay as they were)."""
    if disagg is None:
        return {}
    return {"prefill_replicas": disagg.num_prefill_replicas, "decode_replicas": disagg.num_decode_replicas,
            **({"kv_transfer_bandwidth": disagg.bandwidth_given} if disagg.bandwidth_given is not None else {}),
            **({"kv_transfer_latency": disagg.latency_given} if disagg.latency_given is not None else {})}
