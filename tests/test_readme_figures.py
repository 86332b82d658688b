"""The README's quoted outputs come from the commands next to them: the `kvlab race` quote and the Python
example's commented prints. A change that moves one of these numbers fails here, so the README is mended with it."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    [block] = [b for b in blocks if "resolve(model=" in b]
    return block


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d[\d,]*\.?\d*", text)


def test_the_python_examples_commented_outputs_are_what_it_prints():
    block = _python_example()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    comments = [line.split("#", 1)[1].strip() for line in block.splitlines()
                if line.lstrip().startswith("print(") and "#" in line]
    # The first print: blocks, max_num_seqs, the configuration's key, exactly.
    assert lines[0] == comments[0]
    # The loop's prints, one per strategy, quoted rounded in one comment: "vllm 19.5, orca-max 1.23".
    quoted = dict(part.strip().split(" ") for part in comments[1].split(","))
    got = dict(line.split(" ") for line in lines[1:])
    assert quoted.keys() == got.keys()
    for name, shown in quoted.items():
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        assert f"{float(got[name]):.{decimals}f}" == shown, (name, got[name], shown)


def test_the_race_quote_is_what_kvlab_race_prints(kvlab):
    quote = re.search(r"> (continuous\+paged served the most:.*?); \.\.\.", README, flags=re.S)
    assert quote, "the README's race quote moved"
    quoted = " ".join(quote.group(1).replace(">", " ").split())
    r = kvlab("race")
    assert r.exit_code == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert quoted in said, (quoted, said[-600:])
    assert _numbers(quoted)
