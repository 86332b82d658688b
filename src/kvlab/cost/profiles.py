"""Cost profiles: the cost model's constants, named, frozen and sourced (``kvlab cost`` lists them).

Two kinds, one expression (kvlab/cost/model.py):

- ``efficiency``: fractions of a catalogue GPU's peak bandwidth and FLOP/s, plus CPU overheads in seconds. They
  carry over to any model and GPU (the built-ins: ``roofline``, ``vidur-a100``, ``vidur-h100``, ``paper-2023``).
- ``absolute``: the machine's own times, fitted on it by ``kvlab calibrate`` (seconds to read the weights, per
  context token, per token, per attention pair, plus the overheads). They hold for the model and the machine they
  were measured on (the CPU engine is such a "GPU": no catalogue figure describes it).

A profile is a TOML or JSON file (data/*.toml are the built-ins):

    name = "my-server"
    kind = "efficiency"                 # or "absolute"
    source = "what the numbers are and where they come from"
    model = "llama-2-7b"                # optional: what it was fitted for (a run of another warns)
    gpu = "A100-80GB"                   # optional
    [constants]                         # every constant of the kind: seconds from 0 to 60, efficiencies in (0, 1]
    ...
    [fit]                               # optional: how it was fitted (residuals, uncertainties), shown as is
"""

from __future__ import annotations

import json
import math
import tomllib
import warnings
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvlab.cost.model import PCIE_BANDWIDTH, CostModel
from kvlab.errors import KvlabError

DEFAULT_PROFILE = "roofline"

# name: what it is (the same words in `kvlab cost`, docs/cost.md and the errors).
EFFICIENCY_CONSTANTS = {
    "bandwidth_efficiency": "fraction of peak memory bandwidth reading the weights",
    "attention_bandwidth_efficiency": "fraction of peak memory bandwidth the attention kernel reads K/V at",
    "flops_efficiency": "fraction of peak FLOP/s of the matrix multiplies",
    "attention_flops_efficiency": "fraction of peak FLOP/s of the attention's own FLOPs",
    "overhead_s": "seconds per iteration (scheduling, sampling, launches)",
    "seq_overhead_s": "seconds per scheduled sequence per iteration",
    "prefill_token_overhead_s": "seconds per prefill token",
    "request_latency_s": "seconds a request spends outside the engine (HTTP, queues between processes), per request",
    "allreduce_link_efficiency": "fraction of the GPU link's bandwidth a tensor-parallel all-reduce moves bytes at",
    "allreduce_latency_s": "seconds per tensor-parallel all-reduce call and peer (2 per layer per iteration, tp - 1 "
                           "peers: vLLM's one-shot all-reduce)",
    "admission_lag_iterations": "iterations a request reaching a busy engine waits beyond synchronous admission "
                                "(vLLM's async scheduling: 1)",
    "sampler_logit_s": "seconds the sampler spends per scheduled sequence per vocabulary entry (its logits in "
                       "float32, penalties, temperature, top-k/top-p, the draw)",
    "lag_jitter_iterations": "mean of a seeded exponential draw per request, in its own decode iterations, added to "
                             "its first token and end outside the engine (the time outside the core not the same "
                             "for every request)",
    "lag_step_probability": "probability that a request (a seeded draw each) waits one more of its own decode "
                            "iterations outside the engine, on its first token and end",
}
# Constants a profile may leave out: without allreduce_link_efficiency, all-reduce costs nothing (the built-in
# profiles from before issue 29 price no communication).
OPTIONAL_CONSTANTS = ("allreduce_link_efficiency", "allreduce_latency_s", "admission_lag_iterations", "sampler_logit_s",
                      "lag_jitter_iterations", "lag_step_probability")
PROBABILITIES = ("lag_step_probability",)  # (in [0, 1]: 0 is off)
ABSOLUTE_CONSTANTS = {
    "weights_read_s": "seconds to read the weights once (per iteration)",
    "context_token_s": "seconds to read one context token's K/V",
    "token_s": "seconds of compute per scheduled token",
    "attention_pair_s": "seconds per attention pair (a new token attending to one context token)",
    "overhead_s": "seconds per iteration",
    "seq_overhead_s": "seconds per scheduled sequence per iteration",
    "prefill_token_overhead_s": "seconds per prefill token",
    "request_latency_s": "seconds a request spends outside the engine (HTTP, queues between processes), per request",
}
KINDS = {"efficiency": EFFICIENCY_CONSTANTS, "absolute": ABSOLUTE_CONSTANTS}
FRACTIONS = ("bandwidth_efficiency", "attention_bandwidth_efficiency", "flops_efficiency",
             "attention_flops_efficiency", "allreduce_link_efficiency")
TOP_LEVEL_KEYS = ("name", "kind", "source", "model", "gpu", "constants", "fit")
# Every other constant is seconds per iteration, token, sequence or request: beyond a minute it describes no
# server (and 1e308 overflowed the simulator's sums to NaN).
MAX_SECONDS = 60.0


class CostProfileWarning(UserWarning):
    """A profile used for a model or GPU other than the one it was fitted for (the CLI prints the message)."""


@dataclass(frozen=True)
class CostProfile:
    name: str
    kind: str  # "efficiency" | "absolute"
    source: str
    constants: MappingProxyType  # name -> float, exactly the kind's constants
    model: str = ""  # what it was fitted for ("": any)
    gpu: str = ""
    fit: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    path: str = ""  # the file it was read from ("": built in)

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "source": self.source, "model": self.model, "gpu": self.gpu,
                **dict(self.constants), "fit": _plain(self.fit), "path": self.path}

    def cost_model(self, *, weights_bytes: float, kv_bytes_per_token: float, flops_per_token: float,
                   attention_flops_per_pair: float, gpu, model_id: str, terms=None) -> CostModel:
        """The cost model of a run: this profile on the run's model (per-GPU numbers) and GPU (a GpuSpec).

        ``terms`` (kvlab.cost.terms.Terms) adds what the catalogue knows beyond the roofline: an MoE model's
        routed experts read per iteration, an FP8 model's matmuls at the GPU's FP8 rate, and, with a profile that
        has ``allreduce_link_efficiency``, the tensor-parallel all-reduces.

        A model or GPU other than the profile's is a warning (CostProfileWarning) that says what is assumed;
        the notes go on the model so that a report can repeat them."""
        notes = self._mismatches(model_id, gpu.id)
        for note in notes:
            warnings.warn(note, CostProfileWarning, stacklevel=4)  # (the caller of kvlab.config.resolve)
        c = self.constants
        if self.kind == "absolute":
            return CostModel.from_seconds(**c, profile=self.name, notes=notes)
        if gpu.memory_bandwidth_bytes_per_s is None or gpu.peak_flops is None:
            raise KvlabError(
                f"the catalogue has no memory bandwidth or FLOP/s for {gpu.id}, which the cost profile "
                f"{self.name!r} needs; pick a GPU that has both (kvlab gpus) or an absolute profile (kvlab calibrate)"
            )
        bandwidth, peak_flops, overhead_s = float(gpu.memory_bandwidth_bytes_per_s), float(gpu.peak_flops), c["overhead_s"]
        seq_overhead_s = c["seq_overhead_s"]
        extra: dict = {}
        if terms is not None:
            weights_bytes = terms.dense_weights_bytes
            if terms.num_experts:
                extra.update(expert_read_s=terms.expert_bytes / (bandwidth * c["bandwidth_efficiency"]),
                             num_experts=terms.num_experts, experts_per_token=terms.experts_per_token)
            if terms.matmul_peak_flops != peak_flops:  # (attention stays at the bf16 rate: FLOPs at the matmuls')
                attention_flops_per_pair *= terms.matmul_peak_flops / peak_flops
                peak_flops = terms.matmul_peak_flops
            link_efficiency = c.get("allreduce_link_efficiency")
            if link_efficiency and terms.num_allreduce_calls:
                link = terms.link_bandwidth or PCIE_BANDWIDTH  # (no link in the catalogue: PCIe, as a swap)
                extra["token_overhead_s"] = terms.allreduce_bytes_per_token / (link * link_efficiency)
                overhead_s += terms.num_allreduce_calls * c.get("allreduce_latency_s", 0.0)
            seq_overhead_s += terms.vocab_size * c.get("sampler_logit_s", 0.0)  # (the sampler: kvlab/cost/terms.py)
        return CostModel(
            weights_bytes=weights_bytes, kv_bytes_per_token=kv_bytes_per_token, flops_per_token=flops_per_token,
            attention_flops_per_pair=attention_flops_per_pair,
            memory_bandwidth=bandwidth, peak_flops=peak_flops,
            bandwidth_efficiency=c["bandwidth_efficiency"], flops_efficiency=c["flops_efficiency"],
            overhead_s=overhead_s, **extra,
            # Equal to the matmuls' is "the same" (None), so that the roofline's arithmetic stays as it was.
            attention_bandwidth_efficiency=_unless_equal(c["attention_bandwidth_efficiency"],
                                                         c["bandwidth_efficiency"]),
            attention_flops_efficiency=_unless_equal(c["attention_flops_efficiency"], c["flops_efficiency"]),
            seq_overhead_s=seq_overhead_s, prefill_token_overhead_s=c["prefill_token_overhead_s"],
            request_latency_s=c["request_latency_s"], admission_lag_iterations=c.get("admission_lag_iterations", 0.0),
            lag_jitter_iterations=c.get("lag_jitter_iterations", 0.0),
            lag_step_probability=c.get("lag_step_probability", 0.0),
            profile=self.name, notes=notes,
        )

    def _mismatches(self, model_id: str, gpu_id: str) -> tuple[str, ...]:
        from kvlab.catalog.models import name_key

        notes = []
        if self.model and name_key(self.model) != name_key(model_id):
            what = ("its absolute times are used as they are, which holds only for the model they were measured on"
                    if self.kind == "absolute" else "its efficiencies are assumed to carry over")
            notes.append(f"cost profile {self.name!r} was fitted for {self.model}, this run is {model_id}: {what}")
        if self.gpu and name_key(self.gpu) != name_key(gpu_id):
            what = (f"its absolute times are used as they are ({gpu_id}'s bandwidth and FLOP/s are not used; "
                    f"{gpu_id} only sizes the KV cache unless --num-gpu-blocks does)" if self.kind == "absolute"
                    else f"its efficiencies are assumed to hold on {gpu_id}'s peak bandwidth and FLOP/s")
            notes.append(f"cost profile {self.name!r} was fitted on {self.gpu}, this run is on {gpu_id}: {what}")
        return tuple(notes)


def _unless_equal(value: float, default: float) -> float | None:
    return None if value == default else value


def _plain(value):
    if isinstance(value, MappingProxyType | dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _freeze(value):
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def profile_from_dict(data: Any, where: str) -> CostProfile:
    """A profile from a parsed TOML/JSON document; every mistake is a KvlabError that names ``where``."""
    if not isinstance(data, dict):
        raise KvlabError(f"{where}: a cost profile is a table (TOML) or an object (JSON), got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise KvlabError(f"{where}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], TOP_LEVEL_KEYS)}; "
                         f"valid: {', '.join(TOP_LEVEL_KEYS)}")
    kind = data.get("kind", "efficiency")
    if kind not in KINDS:
        raise KvlabError(f"{where}: kind {kind!r} is not one of: {', '.join(KINDS)}")
    for key in ("name", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise KvlabError(f"{where}: {key!r} is missing or empty (a cost profile states its name and its source)")
    for key in ("model", "gpu"):
        if not isinstance(data.get(key, ""), str):
            raise KvlabError(f"{where}: {key!r} must be a name, got {data[key]!r}")
    constants = _constants(data.get("constants"), kind, where)
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise KvlabError(f"{where}: 'fit' must be a table, got {type(fit).__name__}")
    return CostProfile(name=data["name"].strip(), kind=kind, source=data["source"].strip(),
                       constants=MappingProxyType(constants), model=data.get("model", ""), gpu=data.get("gpu", ""),
                       fit=_freeze(fit), path="" if where.startswith("built-in") else where)


def _constants(raw: Any, kind: str, where: str) -> dict[str, float]:
    expected = KINDS[kind]
    required = [name for name in expected if name not in OPTIONAL_CONSTANTS]
    optional = [name for name in expected if name in OPTIONAL_CONSTANTS]
    needs = f"an {kind} profile needs all of: {', '.join(required)}" + (
        f" (optional: {', '.join(optional)})" if optional else "")
    if not isinstance(raw, dict):
        raise KvlabError(f"{where}: no [constants] table; {needs}")
    unknown = sorted(set(raw) - set(expected))
    if unknown:
        raise KvlabError(f"{where}: unknown constant {unknown[0]!r} for an {kind} profile"
                         f"{_did_you_mean(unknown[0], expected)}; valid: {', '.join(expected)}")
    missing = [name for name in required if name not in raw]
    if missing:
        raise KvlabError(f"{where}: missing constant {missing[0]!r} ({expected[missing[0]]}); {needs}")
    out = {}
    for name in expected:
        if name not in raw:
            continue  # (an optional constant left out)
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise KvlabError(f"{where}: constant {name} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise KvlabError(f"{where}: constant {name} = {value!r} must be finite and >= 0 ({expected[name]})")
        if name in FRACTIONS and not 0 < value <= 1:
            raise KvlabError(f"{where}: constant {name} = {value!r} must be in (0, 1] ({expected[name]})")
        if name in PROBABILITIES and value > 1:
            raise KvlabError(f"{where}: constant {name} = {value!r} must be in [0, 1] ({expected[name]})")
        if name not in FRACTIONS and value > MAX_SECONDS:
            raise KvlabError(f"{where}: constant {name} = {value!r} s is more than {MAX_SECONDS:g} s; valid: 0 to "
                             f"{MAX_SECONDS:g} ({expected[name]})")
        out[name] = value
    return out


def _did_you_mean(name: str, options) -> str:
    import difflib

    hits = [o for o in options if o == name.lower()]  # (ROOFLINE: the names are lower case)
    hits = hits or difflib.get_close_matches(name, list(options), n=2, cutoff=0.5)
    return f" (did you mean {' or '.join(repr(h) for h in hits)}?)" if hits else ""


def read_profile(path: Path) -> CostProfile:
    """A profile file, TOML (.toml) or JSON (anything else that parses as JSON; what does not, with another suffix,
    is refused naming its format: '.yaml is not a profile format')."""
    from kvlab.validate import check_input_file

    check_input_file(path, "cost profile file", "a .toml or .json profile (kvlab calibrate writes one), or a built-in "
                     "profile's name (kvlab cost)")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        suffix = path.suffix.lower()
        if suffix and suffix not in (".toml", ".json"):  # (read as JSON, and it is not: another format, by its suffix)
            raise KvlabError(f"cost profile {str(path)!r}: {suffix} is not a profile format; valid: .toml or .json "
                             "(kvlab calibrate writes one)") from None
        kind = "TOML" if suffix == ".toml" else "JSON"
        raise KvlabError(f"cost profile {str(path)!r} is not valid {kind}: {exc}") from None
    profile = profile_from_dict(data, str(path))
    if profile.name in builtin_profiles():
        # Reports carry a profile's name, and a file named as a built-in (kvlab calibrate --name vllm-h100, as the
        # shipped profile is refitted) would read as the built-in: it is named with its file too.
        profile = replace(profile, name=f"{profile.name} ({path.name})")
    _READ[profile.name] = profile
    return profile


# The profiles read from files in this process, by their own names: what a report that carries only a profile's
# name (a run's cost model, a stored configuration) looks up again. A built-in name is never shadowed.
_READ: dict[str, CostProfile] = {}


def default_profile_for(gpu_id: str) -> str:
    """The profile a run on this GPU gets without --cost: a built-in fitted on measured runs on that GPU (its
    ``[fit]`` names them; ``kvlab calibrate --runs``), else the stated roofline."""
    from kvlab.catalog.models import name_key

    for p in builtin_profiles().values():
        if p.gpu and name_key(p.gpu) == name_key(gpu_id) and p.fit.get("runs"):
            return p.name
    return DEFAULT_PROFILE


def lead_profile(gpu_id: str, profiles: list[str]) -> str:
    """The profile an answer leads with: the one with the best evidence for ``gpu_id`` (fitted on real runs on
    it, kvlab.cost.profiles.default_profile_for) when it is among ``profiles``, else the first."""
    best = default_profile_for(gpu_id)
    return best if best in profiles else profiles[0]


def applicable_profiles(gpu_id: str) -> list[str]:
    """The built-in profiles that can price a run on this GPU: those fitted on it, and those fitted on none (the
    roofline). kvlab capacity prices with each when no --cost is given."""
    from kvlab.catalog.models import name_key

    return [p.name for p in builtin_profiles().values() if not p.gpu or name_key(p.gpu) == name_key(gpu_id)]


@cache
def builtin_profiles() -> dict[str, CostProfile]:
    """The bundled profiles, by name (data/*.toml; the default first)."""
    files = sorted(resources.files("kvlab.cost").joinpath("data").iterdir(), key=lambda f: f.name)
    profiles = {}
    for file in files:
        if file.name.endswith(".toml"):
            profile = profile_from_dict(tomllib.loads(file.read_text(encoding="utf-8")), f"built-in {file.name}")
            profiles[profile.name] = profile
    return {DEFAULT_PROFILE: profiles.pop(DEFAULT_PROFILE), **profiles}


def builtin_file(name: str) -> str | None:
    """Where a built-in profile's TOML is (a file to copy and change: `kvlab cost FILE` reads it back), else None."""
    file = resources.files("kvlab.cost").joinpath("data", f"{name}.toml")
    return str(file) if name in builtin_profiles() and file.is_file() else None


def get_profile(name_or_file: str | None) -> CostProfile:
    """A built-in profile by name, or a profile file (TOML/JSON); None is the default (``roofline``)."""
    if name_or_file is None or name_or_file == "":
        return builtin_profiles()[DEFAULT_PROFILE]
    profiles = builtin_profiles()
    if name_or_file in profiles:
        return profiles[name_or_file]
    if name_or_file in _READ:  # (a report naming a profile this process read from a file)
        return _READ[name_or_file]
    path = Path(name_or_file).expanduser()
    if path.suffix.lower() in (".toml", ".json") or path.exists():
        return read_profile(path)
    raise KvlabError(f"unknown cost profile {name_or_file!r}{_did_you_mean(name_or_file, profiles)}; built in: "
                     f"{', '.join(profiles)} (kvlab cost), or a .toml/.json profile file (kvlab calibrate writes one)")


def write_profile(profile_data: dict, path: Path) -> Path:
    """Write a profile as TOML (.toml) or JSON, after checking that it reads back as a valid profile."""
    profile_from_dict(json.loads(json.dumps(profile_data)), str(path))
    if path.suffix.lower() == ".toml":
        text = _to_toml(profile_data)
        tomllib.loads(text)  # (what it writes reads back)
    else:
        text = json.dumps(profile_data, indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def _to_toml(data: dict, prefix: str = "") -> str:
    """TOML for a profile: scalars and lists of scalars at each level, tables after them."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables:
        name = f"{prefix}{_toml_key(key)}"
        text += f"\n[{name}]\n" + _to_toml(value, prefix=f"{name}.")
    return text


def _toml_key(key: str) -> str:
    """A bare key where TOML allows one (letters, digits, _ and -), else a quoted one."""
    import re

    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise KvlabError(f"cannot write a non-finite number ({value}) into a profile")
        return repr(float(value) if isinstance(value, float) else int(value))  # (numpy's repr is not TOML)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise KvlabError(f"cannot write {type(value).__name__} into a profile")
