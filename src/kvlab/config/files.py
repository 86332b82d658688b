"""Options from a file: ``kvlab run --config FILE`` (as ``vllm serve --config FILE``), a YAML or TOML mapping of
option names to values; the sweep's ``--grid`` files are read by the same parser.

    model: llama-3.1-8b          # names as declared (config/options.py), in either spelling:
    gpu: h100-sxm                # max_num_seqs or max-num-seqs
    max-num-seqs: 512
    rate: 20

A name that is no option is refused with the name and the options there are; a value is checked when the options
are resolved, with the same message as the flag's.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from kvlab.config.options import OPTIONS
from kvlab.errors import KvlabError


def read_mapping(path: Path, flag: str, what: str = "a .yaml, .yml or .toml file of options") -> dict[str, Any]:
    """A YAML (.yaml, .yml) or TOML (.toml) file's top-level mapping; ``flag`` names it in a message, ``what`` says
    what file it wants."""
    from kvlab.validate import check_input_file

    check_input_file(path, flag, what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KvlabError(f"{flag} {path}: cannot read it as UTF-8 text ({exc.reason} at byte {exc.start}); "
                         f"valid: {what}") from None
    except OSError as exc:
        raise KvlabError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:  # (a float with an exponent keeps its text, as the YAML reader keeps it: 1e3 is a count nowhere)
            data = tomllib.loads(text, parse_float=_toml_float)
        except tomllib.TOMLDecodeError as exc:
            raise KvlabError(f"{flag} {path}: not valid TOML ({exc})") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        from kvlab.validate import decimal_yaml_loader

        try:  # (numbers in decimal digits only: YAML 1.1 reads 5_0 as 50 and 010 as 8; kvlab.validate.NUMBER_TEXT)
            data = yaml.load(text, Loader=decimal_yaml_loader())  # noqa: S506 (a SafeLoader: yaml.safe_load's)
        except yaml.YAMLError as exc:
            raise KvlabError(f"{flag} {path}: not valid YAML ({_yaml_problem(exc)})") from None
    else:
        raise KvlabError(f"{flag} {path}: a file of options ends in .yaml, .yml or .toml")
    if not isinstance(data, dict):
        raise KvlabError(f"{flag} {path}: expected a mapping of option names to values")
    if suffix in (".yaml", ".yml") and any(isinstance(data.get(key), dict) for key in ("data", "load")):
        # (inference-perf's layout, data: {type: shared_prefix, ...} and load: {stages: ...}: a workload)
        raise KvlabError(f"{flag} {path}: this is an inference-perf workload file (data:, load:), not {what}; "
                         f"run it as a workload: -w {path}")
    return data


def _toml_float(text: str) -> float | str:
    """A TOML float as the options read it: its text where it has an exponent (1e3: refused for a whole-number option
    as the flag refuses --max-num-seqs 1e3, read by a real-number option's check), else the float (trial 54)."""
    return text if "e" in text.lower() else float(text)


def _yaml_problem(exc: Exception) -> str:
    """PyYAML's error in one line: its problem and where (line, column), without the caret block it prints."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem is None:
        return " ".join(str(exc).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)


def option_name(spelling: str, where: str, extra: tuple[str, ...] = ()) -> str:
    """The declared option a file's key names (``max-num-seqs``, ``max_num_seqs``, ``--max-num-seqs``), or an
    error naming it and the options there are (``extra``: names a file may hold beside them)."""
    name = spelling.strip().lstrip("-").replace("-", "_")
    if name in OPTIONS or name in extra:
        return name
    valid = [*extra, *OPTIONS]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise KvlabError(f"{where}: {spelling!r} is not an option{hint}; the options are: {', '.join(valid)}")


# `vllm serve` arguments a config file written for vLLM holds that set its HTTP server, its logs, its tokenizer or how
# it loads the checkpoint, none of which changes the engine's schedule or its KV cache: read and passed over.
SERVER_ONLY = ("host", "port", "api_key", "served_model_name", "uvicorn_log_level", "disable_log_requests",
               "enable_log_requests", "disable_log_stats", "allowed_origins", "allowed_methods", "allowed_headers",
               "ssl_keyfile", "ssl_certfile", "root_path", "middleware", "chat_template", "response_role",
               "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "trust_remote_code", "download_dir",
               "tokenizer", "tokenizer_mode", "load_format", "disable_fastapi_docs", "max_log_len")


def server_only_keys(path: Path, flag: str = "--config") -> list[str]:
    """The keys of a --config file that only vLLM's server reads (SERVER_ONLY), as written there."""
    return [str(k) for k in read_mapping(path, flag) if str(k).strip().lstrip("-").replace("-", "_") in SERVER_ONLY]


def _as_written(path: Path, flag: str, key: Any, value: float) -> str:
    """A text option the file wrote as a number (vllm-version: 0.10, which YAML reads as 0.1): its text as written,
    read again from the YAML; a TOML number has lost it, and is refused saying to quote it (trial 52)."""
    if path.suffix.lower() == ".toml":
        raise KvlabError(f"{flag} {path}: {key} is a number ({value!r}) where a text is wanted: write it in quotes, "
                         f'{key} = "..." (a TOML number loses its digits: 0.10 reads as 0.1)')
    import yaml

    root = yaml.compose(path.read_text(encoding="utf-8"))
    for key_node, value_node in getattr(root, "value", ()):
        if getattr(key_node, "value", None) == key and isinstance(value_node, yaml.ScalarNode):
            return value_node.value
    return str(value)


def read_options(path: Path, flag: str = "--config") -> dict[str, Any]:
    """A file of option values (one value each), by declared name; `vllm serve`'s server-only keys passed over."""
    options = {}
    for key, value in read_mapping(path, flag).items():
        if str(key).strip().lstrip("-").replace("-", "_") in SERVER_ONLY:
            continue
        if isinstance(value, (list, dict)):
            raise KvlabError(f"{flag} {path}: {key!r} has a {type(value).__name__}; a run takes one value per "
                             "option (kvlab sweep --grid takes lists)")
        name = option_name(str(key), f"{flag} {path}")
        if OPTIONS[name].kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = _as_written(path, flag, key, value)
        options[name] = value
    from kvlab.validate import VLLM_HUMAN_READABLE_INT_ARGS, check_options, vllm_human_readable_int

    for name in VLLM_HUMAN_READABLE_INT_ARGS:  # (max-model-len: 32k, as `vllm serve --config` reads it: 32,000)
        if isinstance(options.get(name), str):
            try:
                number = vllm_human_readable_int(options[name])
            except ValueError as exc:
                raise KvlabError(f"{flag} {path}: {name} {options[name]!r}: {exc}") from None
            options[name] = options[name] if number is None else number

    try:  # (each value against its range here, so the error names the file it is in)
        check_options(options, spelling="file")
    except KvlabError as exc:
        raise KvlabError(f"{flag} {path}: {exc}") from None
    return options
