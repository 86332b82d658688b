"""Read a vLLM startup log as people paste it, and explain its KV cache figures the lesson's way.

    from kvlab.vllm.log import parse_vllm_log, explain_vllm_log
    log = parse_vllm_log(text)          # StartupLog; KvlabError naming the lines looked for if none is there
    log.to_json()                       # the figures, the line each was read from, per-worker repeats
    explain_vllm_log(log, model=None)   # {"lines": [...], and with a known model "kvlab", "differences"}

lines.py reads the lines (every format vLLM has printed, inside whatever wraps them), startup.py makes them one
StartupLog, explain.py explains it and puts kvlab's own sizing beside vLLM's. No I/O: the CLI reads the file.
"""

from kvlab.vllm.log.explain import LABELS, as_read, explain_vllm_log, format_figure, kvlab_calculation, resolve_model
from kvlab.vllm.log.lines import clean_line, parse_args_dict, read_lines
from kvlab.vllm.log.startup import StartupLog, parse_vllm_log

__all__ = ["LABELS", "StartupLog", "as_read", "clean_line", "explain_vllm_log", "format_figure", "kvlab_calculation",
           "parse_args_dict", "parse_vllm_log", "read_lines", "resolve_model"]
