"""Writes kvlab's fit of ShareGPT's lengths, the shape of the paper-sharegpt stand-in.

    KVLAB_TRACES_DIR=../shared/data/traces python scripts/fit_paper_sharegpt.py

reads the published sharegpt-8k trace (wherever kvlab finds it: `kvlab workloads fetch sharegpt-8k` puts it in the
cache), checks that its bytes are the published ones, and writes src/kvlab/workload/data/paper_sharegpt_fit.json.
tests/test_workload_published.py checks that the shipped file is what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.workload import published, synthetic, traces
from kvlab.workload.fetch import matches_checksum

OUT = Path(__file__).resolve().parents[1] / "src" / "kvlab" / "workload" / "data" / synthetic.SHAREGPT_FIT_FILE


def shipped_fit() -> dict:
    trace = published.TRACES[synthetic.SHAREGPT_SHAPE]
    path = published.require(trace.name)
    if not matches_checksum(path, trace.checksum):
        raise KvlabError(f"{path} is not the published {trace.name} file (its checksum is not {trace.checksum})")
    source = {"trace": trace.name, "url": trace.url, "checksum": trace.checksum, "licence": trace.licence,
              "citation": trace.citation}
    return synthetic.fit_length_shape(traces.read_length_stats(path), source)


def main() -> int:
    try:
        fit = shipped_fit()
    except KvlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    OUT.write_text(json.dumps(fit, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({fit['num_rows']:,} rows fitted; Spearman {fit['spearman']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
