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


def refused_answer(error: KvlabError, *, model: str, gpu: str, concurrency: int, context_len: int,
                   gpu_memory_utilization: float, max_utilization: float, parameters=()) -> dict:
    """``{"error": the engine's reason without flags, "advice": [what to change on the page], "refused": true}``.
    A flag the endpoint takes as a parameter (``parameters``) is named as the parameter, as in_parameters does
    ("--quantization: ..." -> "quantization: ..."); advice naming any other flag is cut."""
    reason = str(in_parameters(error, parameters))
    for pattern in CLI_ADVICE:
        reason = pattern.sub("", reason)
    del concurrency  # (how many conversations fit is an answer, never a refusal)
    return {"error": reason, "advice": _advice(model, gpu, context_len, gpu_memory_utilization, max_utilization),
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


def _least_utilization(model: str, gpu: str, utilization: float, max_utilization: float) -> float | None:
    """The least utilization, in hundredths up to the page's highest, at which vLLM starts with the model on
    ``gpu``: the value `kvlab size`'s refusal advises (the same rule, kvlab.sizing's)."""
    from kvlab.web.calculator import least_utilization

    return least_utilization(model=model, gpu=gpu, gpu_memory_utilization=utilization, most=max_utilization)


def _advice(model: str, gpu: str, context_len: int, utilization: float,
            max_utilization: float) -> list[str]:
    from kvlab.catalog import list_gpus

    unknown = _unknown(model, gpu)
    if unknown:  # (nothing about its size can be said: it is not one the engine knows)
        return unknown
    same = {"concurrency": 1, "context_len": 1, "model": model}
    if _fits(**same, gpu=gpu, gpu_memory_utilization=utilization) is None:
        # The model does not fit on this GPU at all: more of this one (as `kvlab size` advises: the least at which
        # vLLM starts), or another GPU that holds its weights (as size's "a larger GPU" does).
        advice = []
        least = _least_utilization(model, gpu, utilization, max_utilization)
        if least is not None:
            advice.append(f"raise GPU memory utilization to {least:g}" + (
                " (the most there is: nothing left on the GPU for anything else)" if least >= 1 else
                " (the least at which vLLM starts)"))
        gpus = [g.id for g in sorted(list_gpus(), key=lambda g: g.memory_bytes) if g.id.lower() != gpu.lower()]
        others = [g for g in gpus if _fits(**same, gpu=g, gpu_memory_utilization=utilization) is not None]
        if others:
            advice.append(f"pick a GPU it fits on: {', '.join(others[:3])}")
        elif max_utilization > utilization:
            others = [g for g in gpus if _fits(**same, gpu=g, gpu_memory_utilization=max_utilization) is not None]
            if others:
                advice.append(f"raise GPU memory utilization to {max_utilization:g} and pick a GPU it then fits on: "
                              f"{', '.join(others[:3])}")
        if not advice:
            advice.append("pick a smaller model: no GPU in the menu holds this one's weights")
        return advice
    fitted = _fits(**same, gpu=gpu, gpu_memory_utilization=utilization)
    assert fitted is not None
    if context_len > fitted["max_model_len"]:
        return [f"type at most {fitted['max_model_len']:,} in tokens each ({model}'s max_model_len)"]
    return []
