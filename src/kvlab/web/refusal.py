"""The calculator's refusals in the page's words: what the engine refused, and what to change among the controls
the page has (model, GPU, conversations, tokens each, GPU memory utilization), never a command-line flag.

kvlab.sizing words its refusals for the command line ("Would fit: --tensor-parallel-size 2"). The page has no
such control, so the flag advice is cut and the page's own advice is found by asking the engine again: each
catalogue GPU at the same utilization, this GPU at the highest utilization the page takes, the longest context the
model allows. Nothing here decides what fits; ``answer`` (kvlab.sizing) does.
"""

from __future__ import annotations

import re

from kvlab.errors import KvlabError

# The command line's advice, cut from the engine's message (its first sentence says what was refused and why):
# its alternatives, a parenthesis naming a flag, and one naming a kvlab command ("(kvlab models)": the page's menus
# are its list).
CLI_ADVICE = (re.compile(r"\. Would fit: .*$"), re.compile(r"\. Nothing in the catalogue fits.*$"),
              re.compile(r" \([^()]*--[a-z][a-z-]*[^()]*\)"), re.compile(r" \(kvlab [a-z ]+\)"))


# The command line's flag for what an endpoint calls otherwise (the page's "KV blocks" is num_blocks).
FLAG_PARAMETERS = {"num_gpu_blocks": "num_blocks"}
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?:[ =]([^\s;,()]*[0-9._-][^\s;,()]*?))?(?=[\s;,():]|\.?$|\.\s)")
_FLAG_CLAUSE = re.compile(r"[;,]\s*[^;,]*--[a-z][a-z-]*[^;,]*?(?=[;,]|\.?$)")


def in_parameters(error: KvlabError, parameters) -> KvlabError:
    """``error`` (worded for the command line) in an API endpoint's words: a flag the endpoint takes as a parameter
    (``parameters``: its names) becomes the parameter (``--gpu h100-sxm`` -> ``gpu=h100-sxm``); advice that names a
    flag it does not take is cut, as the page's is (CLI_ADVICE), never offered."""
    def parameter(match: re.Match) -> str:
        name = match.group(1).replace("-", "_")
        name = FLAG_PARAMETERS.get(name, name)
        if name not in parameters:
            return match.group(0)
        return f"{name}={match.group(2)}" if match.group(2) else name

    message = _FLAG.sub(parameter, str(error))
    head, said, tail = message.partition(". Would fit: ")
    if said:  # keep the alternatives the endpoint can take ("gpu_memory_utilization=0.95"), drop the others
        kept = [alternative for alternative in tail.split("; ") if "--" not in alternative]
        message = head + (f". Would fit: {'; '.join(kept)}" if kept else "")
    if "--" in message:
        for pattern in (*CLI_ADVICE, _FLAG_CLAUSE):
            message = pattern.sub("", message)
    return KvlabError(message) if message.strip() else error


def refused_answer(error: KvlabError | str, *, model: str, gpu: str, concurrency: int, context_len: int,
                   gpu_memory_utilization: float, max_utilization: float, parameters=(),
                   max_model_len: int | None = None, page: bool = True, held_is_enough: bool = False) -> dict:
    """``{"error": the engine's reason without flags, "advice": [what to change on the page], "refused": true}``.
    A flag the endpoint takes as a parameter (``parameters``) is named as the parameter, as in_parameters does
    ("--quantization: ..." -> "quantization: ..."); advice naming any other flag is cut."""
    reason = str(in_parameters(KvlabError(str(error)), parameters))
    for pattern in CLI_ADVICE:
        reason = pattern.sub("", reason)
    del concurrency  # (how many conversations fit is an answer, never a refusal)
    return {"error": reason, "advice": _advice(model, gpu, context_len, gpu_memory_utilization, max_utilization,
                                               max_model_len, page=page, held_is_enough=held_is_enough),
            "refused": True}


def _unknown(model: str, gpu: str) -> list[str]:
    """The page's advice where the model or the GPU is not in the catalogue (not one of the menus' entries): pick
    one from the menu; empty where both are known."""
    from kvlab.catalog import get_gpu
    from kvlab.catalog.models import find_catalogue_model

    advice = [] if find_catalogue_model(model) is not None else ["pick a model from the model menu"]
    try:
        get_gpu(gpu)
    except KvlabError:
        advice.append("pick a GPU from the GPU menu")
    return advice


def _fits(**kwargs) -> dict | None:
    from kvlab.web.calculator import answer

    try:
        return answer(**kwargs)
    except KvlabError:
        return None


def _advice(model: str, gpu: str, context_len: int, utilization: float, max_utilization: float,
            max_model_len: int | None = None, *, page: bool = True, held_is_enough: bool = False) -> list[str]:
    """What to change where vLLM would not start (the weights not held, or one max_model_len request's cache not
    fitting: kvlab.sizing's own rule, as `kvlab size` refuses), or where the context is longer than max_model_len:
    each GPU offered is one where it starts at this max_model_len (None: the model's own). ``page``: the page,
    which sets no max_model_len; else the API, which takes it. ``held_is_enough``: a lab run's refusal, where a GPU
    that holds the weights is enough (a run sizes its max_model_len by its workload, kvlab.config.resolve)."""
    from kvlab.catalog import list_gpus
    from kvlab.web.calculator import least_utilization, starts_with

    unknown = _unknown(model, gpu)
    if unknown:  # (nothing about its size can be said: it is not one the engine knows)
        return unknown
    asked = {"model": model, "max_model_len": max_model_len}

    def starts(gpu: str, utilization: float):
        if held_is_enough:
            return _fits(**asked, gpu=gpu, gpu_memory_utilization=utilization, concurrency=1, context_len=1)
        return starts_with(**asked, gpu=gpu, gpu_memory_utilization=utilization)

    if starts(gpu, utilization) is None:
        # More of this GPU (as `kvlab size` advises: the least at which vLLM starts), or another GPU it starts on.
        advice = []
        least = least_utilization(**asked, gpu=gpu, gpu_memory_utilization=utilization, most=max_utilization)
        if least is not None:
            advice.append(f"raise GPU memory utilization to {least:g}" + (
                " (the most there is: nothing left on the GPU for anything else)" if least >= 1 else
                " (the least at which vLLM starts)"))
        gpus = [g.id for g in sorted(list_gpus(), key=lambda g: g.memory_bytes) if g.id.lower() != gpu.lower()]
        others = [g for g in gpus if starts(g, utilization) is not None]
        if others:
            advice.append(f"pick a GPU it fits on: {', '.join(others[:3])}")
        elif max_utilization > utilization:
            others = [g for g in gpus if starts(g, max_utilization) is not None]
            if others:
                advice.append(f"raise GPU memory utilization to {max_utilization:g} and pick a GPU it then fits on: "
                              f"{', '.join(others[:3])}")
        return advice or [_shorter(model, [gpu, *gpus], max(utilization, max_utilization), max_model_len, page)]
    fitted = _fits(model=model, gpu=gpu, gpu_memory_utilization=utilization, concurrency=1, context_len=1,
                   max_model_len=max_model_len)
    assert fitted is not None
    if context_len > fitted["max_model_len"]:
        return [f"type at most {fitted['max_model_len']:,} in tokens each ({model}'s max_model_len)"]
    return []


def _shorter(model: str, gpus: list[str], utilization: float, max_model_len: int | None, page: bool) -> str:
    """The advice where no GPU starts ``model`` at this max_model_len: the GPUs that hold its weights, each with the
    longest max_model_len vLLM starts with there (its estimate, as `kvlab size` advises); a smaller model where
    none holds them."""
    from kvlab.web.calculator import longest_start

    held = sorted(((n, g) for g in gpus if (n := longest_start(model=model, gpu=g, gpu_memory_utilization=utilization))
                   and (max_model_len is None or n < max_model_len)), reverse=True)[:3]
    if not held:
        return "pick a smaller model: no GPU in the menu holds this one's weights"
    at = ", ".join(f"{g} at max_model_len ≤ {n:,}" for n, g in held)
    if page:  # (the page sets no max_model_len: the model's own)
        return f"pick a smaller model: no GPU in the menu starts this one at its full max_model_len ({at})"
    return f"set a shorter max_model_len and pick a GPU it then fits on: {at}" + (
        f" (utilization {utilization:g})" if utilization < 1 else "")
