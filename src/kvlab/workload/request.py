"""A request, as the simulator and the real-engine driver both see it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload.

    ``output_len`` is the true length of the answer (what the model would generate before stopping);
    ``max_tokens`` is the client's cap, if any: the answer stops at ``min(output_len, max_tokens)``.

    ``prefix_hashes`` describe a shared prompt prefix, Mooncake style: the first
    ``len(prefix_hashes) * prefix_chunk_len`` prompt tokens are chunk after chunk of content named by these ids,
    so two requests whose leading ids are equal share those tokens (and, with prefix caching, those KV blocks).
    The rest of the prompt is unique to the request, its last token always: no two prompts are identical (a
    whole-prompt hit would leave nothing to compute; the real-engine driver builds token ids the same way).

    ``prefix_len`` says instead how many leading tokens of the request's whole sequence, prompt then answer, the
    ids name: a turn of a conversation, whose answer the next turn's prompt repeats (``len(prefix_hashes) *
    prefix_chunk_len`` must cover them). Its answer's blocks are then named by content too, and the next turn,
    whose ids begin with the same ones, finds them cached (kvlab.workload.sessions). None: the prompt but its
    last token, as a trace's hash ids describe a prompt.
    """

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    max_tokens: int | None = None
    prefix_hashes: tuple[int, ...] = ()
    prefix_chunk_len: int = 512
    n: int = 1
    prefix_len: int | None = None
    #: vLLM's request priority under ``--scheduling-policy priority``: smaller is served first (0, vLLM's default).
    priority: int = 0
    #: Seconds after its arrival the client waits for the whole answer before it gives up (the engine then aborts
    #: the request, as vLLM aborts one whose client disconnected); None: it waits as long as it takes.
    timeout: float | None = None
    # Derived once here, read as plain attributes: the simulator reads them several times per request, and a
    # property costs a call each time.
    #: How many tokens the answer really has: the true length, capped by ``max_tokens``.
    num_output_tokens: int = field(init=False, repr=False, compare=False)
    #: KV slots the request writes over its life: the last sampled token is never fed back.
    num_kv_tokens: int = field(init=False, repr=False, compare=False)
    #: Leading tokens of the sequence named by ``prefix_hashes`` (a prompt's, or with ``prefix_len`` beyond). (A
    #: property was a Python call for each read, ~900 instructions from the compiled allocator: benchmarks/README.md.)
    num_shared_prefix_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        num_output_tokens = self.output_len if self.max_tokens is None else min(self.output_len, self.max_tokens)
        object.__setattr__(self, "num_output_tokens", num_output_tokens)
        object.__setattr__(self, "num_kv_tokens", self.prompt_len + num_output_tokens - 1)
        named = self.prompt_len - 1 if self.prefix_len is None else self.prefix_len
        object.__setattr__(self, "num_shared_prefix_tokens", min(named, len(self.prefix_hashes) * self.prefix_chunk_len))
