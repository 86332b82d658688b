"""Published traces: kvlab ships none; it finds a copy (a path, KVLAB_TRACES_DIR, the cache) or fetches one from its
publisher with its checksum checked; its own workloads need no trace at all."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import runpy
import shutil
import subprocess
import sys
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kvlab.errors import KvlabError
from kvlab.workload import WORKLOADS, load_workload
from kvlab.workload.fetch import fetch, file_checksum, matches_checksum
from kvlab.workload.published import TRACES, how_to_get, locate, require
from kvlab.workload.synthetic import PAPER_SHAREGPT_MEANS, paper_sharegpt_population, sharegpt_shape_fit
from tests.conftest import REPO, SHARED_TRACES


@pytest.fixture
def no_traces(monkeypatch, tmp_path):
    """A machine with no trace: KVLAB_TRACES_DIR unset, an empty cache."""
    monkeypatch.delenv("KVLAB_TRACES_DIR", raising=False)
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


def _no_trace_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KVLAB_TRACES_DIR"}
    env["KVLAB_CACHE_DIR"] = str(tmp_path / "empty-cache")
    env["COLUMNS"] = "100"
    return env


# --- what kvlab ships ---------------------------------------------------------------------------------------------


def test_the_built_wheel_holds_no_third_party_data_file(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(REPO / "build_backend", source / "build_backend", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("kvlab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        digests = {f"sha256:{hashlib.sha256(archive.read(n)).hexdigest()}" for n in names}
    published_names = {filename for trace in TRACES.values() for filename in trace.filenames}
    assert not [n for n in names if Path(n).name in published_names]
    assert not digests & {trace.checksum for trace in TRACES.values()}
    assert not [n for n in names if n.endswith((".csv", ".jsonl"))]
    data = sorted(n for n in names if n.startswith("kvlab/workload/data/"))
    assert data == ["kvlab/workload/data/paper_sharegpt_fit.json"]
    assert "kvlab/workload/published.py" in names and "kvlab/workload/traces.py" in names


def test_the_shipped_sharegpt_fit_is_what_the_script_derives_from_the_published_trace():
    derive = runpy.run_path(str(REPO / "scripts" / "fit_paper_sharegpt.py"))["shipped_fit"]
    assert derive() == sharegpt_shape_fit()


def test_the_paper_sharegpt_stand_in_has_the_papers_means_and_cap():
    population = paper_sharegpt_population()
    assert population.num_rows + population.num_skipped == sharegpt_shape_fit()["num_rows"]
    assert population.prompt_len.mean() == pytest.approx(PAPER_SHAREGPT_MEANS[0], abs=0.01)
    assert population.output_len.mean() == pytest.approx(PAPER_SHAREGPT_MEANS[1], abs=0.01)
    assert int((population.prompt_len + population.output_len).max()) <= 2048
    assert population.prompt_len.min() >= 1 and population.output_len.min() >= 1


def test_every_published_trace_is_a_named_workload_and_the_shared_copies_are_the_published_bytes():
    assert set(TRACES) <= set(WORKLOADS)
    for name, trace in TRACES.items():
        located = locate(name)
        assert located is not None and located.where == "KVLAB_TRACES_DIR", name
        if name != "burstgpt" and name != "llmservingsim-sharegpt":  # the collection keeps excerpts of these two
            assert matches_checksum(located.path, trace.checksum), name


# --- with no trace on the machine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["race", "-n", "200"], ["paper", "fig2"], ["run", "vllm", "--workload", "sessions",
                                                                             "-n", "50"]])
def test_kvlabs_own_workloads_run_with_no_trace_present(tmp_path, argv):
    done = subprocess.run([sys.executable, "-m", "kvlab", *argv], env=_no_trace_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_the_lab_serves_its_page_with_no_trace_present(tmp_path):
    server = subprocess.Popen([sys.executable, "-m", "kvlab", "lab", "--port", "0", "--no-browser"],
                              env=_no_trace_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        url = line.split("kvlab lab: ", 1)[1].split()[0]
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "<html" in page.lower()
        choices = json.loads(urllib.request.urlopen(url + "api/catalog", timeout=60).read())
        assert "paper-sharegpt" in [w["name"] for w in choices["workloads"]]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_absent_trace_says_in_one_line_how_to_get_it(kvlab, no_traces):
    result = kvlab("run", "vllm", "--workload", "azure-conv", "-n", "10")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {how_to_get('azure-conv')}"]
    assert "kvlab workloads fetch azure-conv" in lines[0] and "KVLAB_TRACES_DIR" in lines[0]


def test_kvlab_workloads_says_which_traces_are_absent(kvlab, no_traces):
    rows = {row["name"]: row for row in kvlab("workloads", "--json").json()}
    assert rows["azure-conv"]["present"] is False and rows["azure-conv"]["num_rows"] is None
    assert rows["azure-conv"]["copy"] == "absent" and rows["azure-conv"]["location"] == "kvlab workloads fetch azure-conv"
    assert rows["azure-conv"]["checksum"] == TRACES["azure-conv"].checksum
    assert rows["azure-conv"]["url"] == TRACES["azure-conv"].url
    assert rows["azure-conv"]["filenames"] == list(TRACES["azure-conv"].filenames)
    assert rows["paper-sharegpt"]["present"] is True and rows["paper-sharegpt"]["copy"] == "built in"
    assert rows["paper-sharegpt"]["checksum"] is None
    table = kvlab("workloads").stdout
    assert "azure-conv" in table and "absent" in table


def test_kvlab_workloads_lists_everything_when_a_copy_or_the_variable_is_bad(kvlab, monkeypatch, tmp_path):
    (tmp_path / "azure2023_conv.csv").write_text("hello world\n")
    (tmp_path / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv").write_bytes(b"\x87\x00\xff")
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(tmp_path))
    result = kvlab("workloads")
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in kvlab("workloads", "--json").json()}
    assert rows["azure-conv"]["copy"] == "unreadable" and "no column 'TIMESTAMP'" in rows["azure-conv"]["location"]
    assert rows["arxiv"]["copy"] == "unreadable" and "not a text file" in rows["arxiv"]["location"]
    assert rows["azure-code"]["copy"] == "absent" and rows["paper-sharegpt"]["num_rows"] is not None
    assert "azure-conv is unreadable: " in result.stdout
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(tmp_path / "nowhere"))
    result = kvlab("workloads", "--json")
    assert result.exit_code == 0, result.stderr
    assert all(row["copy"] in ("unreadable", "built in") for row in result.json())


def test_a_traces_dir_that_is_not_a_folder_is_named(kvlab, monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    result = kvlab("run", "vllm", "--workload", "bwb", "-n", "10")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: KVLAB_TRACES_DIR={str(tmp_path / 'nowhere')!r} is not a folder; valid: a folder holding the published "
        f"trace files (their names: docs/workloads.md), or unset it to use the cache {tmp_path / 'cache' / 'traces'}"
    ]


def test_a_malformed_copy_is_named_with_what_was_expected(kvlab, monkeypatch, tmp_path):
    (tmp_path / "azure2023_conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,12,x\n")
    (tmp_path / "conversation_trace.jsonl").write_text('{"timestamp": 0, "input_length": 5}\n')
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(tmp_path))
    result = kvlab("run", "vllm", "--workload", "azure-conv", "-n", "1")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"{tmp_path / 'azure2023_conv.csv'}: a row does not parse" in result.stderr
    result = kvlab("run", "vllm", "--workload", "mooncake-conversation", "-n", "1")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {tmp_path / 'conversation_trace.jsonl'}, line 1: no field 'output_length'; "
                                     "valid: rows with timestamp, input_length, output_length, hash_ids")


def test_a_path_to_a_copy_is_read_as_that_trace(tmp_path, no_traces):
    copy = tmp_path / "AzureLLMInferenceTrace_code.csv"
    shutil.copy(SHARED_TRACES / "azure2023_code.csv", copy)
    from_path = load_workload(str(copy), num_requests=50)
    with pytest.raises(KvlabError, match="kvlab workloads fetch azure-code"):
        load_workload("azure-code", num_requests=50)
    os.environ["KVLAB_TRACES_DIR"] = str(SHARED_TRACES)
    try:
        assert from_path.requests == load_workload("azure-code", num_requests=50).requests
    finally:
        del os.environ["KVLAB_TRACES_DIR"]
    assert "Azure/AzurePublicDataset" in from_path.source


# --- fetching from a publisher (a real HTTP server on 127.0.0.1) ----------------------------------------------------


@pytest.fixture
def publisher():
    """The shared copies served over HTTP on 127.0.0.1, as a publisher would serve them; yields its base URL."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args):
            super().__init__(*args, directory=str(SHARED_TRACES))

        def log_message(self, *args):  # quiet: the tests read the command's output
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_fetch_with_the_published_checksum_is_saved_under_the_published_name(publisher, tmp_path):
    path = fetch("azure-code", url=f"{publisher}/azure2023_code.csv", destination=tmp_path)
    assert path == tmp_path / "AzureLLMInferenceTrace_code.csv"
    assert path.read_bytes() == (SHARED_TRACES / "azure2023_code.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["AzureLLMInferenceTrace_code.csv"]


def test_a_fetch_whose_checksum_differs_saves_nothing(publisher, tmp_path):
    with pytest.raises(KvlabError) as error:
        fetch("azure-conv", url=f"{publisher}/azure2023_code.csv", destination=tmp_path)
    assert str(error.value) == (
        f"the file downloaded from {publisher}/azure2023_code.csv is not the published azure-conv: its checksum is "
        f"{TRACES['azure-code'].checksum}, the published one {TRACES['azure-conv'].checksum}; nothing was saved")
    assert list(tmp_path.iterdir()) == []


def test_a_fetch_from_a_server_that_is_gone_or_answers_404_saves_nothing(publisher, tmp_path):
    with pytest.raises(KvlabError, match=r"answered HTTP 404; check the address"):
        fetch("azure-conv", url=f"{publisher}/no-such-file.csv", destination=tmp_path)
    import socket

    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(KvlabError, match=r"could not download azure-conv from http://127.0.0.1:\d+/x.csv \(.*\)"):
        fetch("azure-conv", url=f"http://127.0.0.1:{port}/x.csv", destination=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_kvlab_workloads_fetch_prints_the_licence_and_citation_and_the_trace_is_then_found(publisher, kvlab, no_traces):
    result = kvlab("workloads", "fetch", "mooncake-synthetic", "--from", f"{publisher}/mooncake_fast25_synthetic_trace.jsonl")
    assert result.exit_code == 0, result.stderr
    trace = TRACES["mooncake-synthetic"]
    assert f"licence: {trace.licence}" in result.stdout and f"cite: {trace.citation}" in result.stdout
    assert f"checksum {trace.checksum} verified" in result.stdout
    located = locate("mooncake-synthetic")
    assert located is not None and located.where == "cache" and located.path == no_traces / "synthetic_trace.jsonl"
    assert load_workload("mooncake-synthetic", num_requests=5).num_requests == 5
    again = kvlab("workloads", "fetch", "mooncake-synthetic", "--from", f"{publisher}/nothing-there")
    assert again.exit_code == 0 and "already in the cache with the published checksum" in again.stdout
    assert kvlab("workloads", "fetch", "mooncake-synthetic", "--force", "--from", f"{publisher}/nothing-there").exit_code == 2
    assert located.path.is_file()  # a failed fetch leaves the good copy
    built_in = kvlab("workloads", "fetch", "paper-sharegpt")
    assert built_in.exit_code == 2 and "paper-sharegpt is one of kvlab's own workloads, built in" in built_in.stderr


def test_a_damaged_cached_copy_says_fetch_again(kvlab, no_traces):
    no_traces.mkdir(parents=True)
    (no_traces / "AzureLLMInferenceTrace_code.csv").write_text("")
    result = kvlab("run", "vllm", "--workload", "azure-code", "-n", "5")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {no_traces / 'AzureLLMInferenceTrace_code.csv'}: the file is empty; valid: "
                                     "the file as published; the cached copy is damaged: run `kvlab workloads fetch "
                                     "azure-code` again")


@pytest.mark.parametrize("source", ["/work/traces/azure2023_conv.csv", "ftp://example.org/x.csv", "notaurl"])
def test_fetch_from_takes_an_http_address(kvlab, no_traces, source):
    result = kvlab("workloads", "fetch", "azure-conv", "--from", source)
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --from {source!r} is not an http(s) address; for a file on this machine, "
                                     "give its path as --workload (named AzureLLMInferenceTrace_conv.csv) or put it in "
                                     "a folder named by KVLAB_TRACES_DIR")


def test_a_cache_that_cannot_be_written_says_what_to_set(kvlab, monkeypatch, tmp_path, publisher):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "a-file"))
    result = kvlab("workloads", "fetch", "azure-code", "--from", f"{publisher}/azure2023_code.csv")
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("set KVLAB_CACHE_DIR to a folder you can write in")


def test_checksums_are_sha256_or_gits_blob_id(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(b"prompt_len,output_len\n3,4\n")
    assert file_checksum(path, "sha256") == f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    assert file_checksum(path, "git-blob-sha1") == f"git-blob-sha1:{git}"
    assert all(t.checksum.split(":")[0] in ("sha256", "git-blob-sha1") for t in TRACES.values())


def test_require_names_the_trace_when_it_is_absent(no_traces):
    with pytest.raises(KvlabError) as error:
        require("bwb")
    assert str(error.value) == how_to_get("bwb")
    assert not no_traces.exists()  # a look-up creates no folder


@pytest.mark.parametrize(("published", "trace"), [("azure2023_conv.csv", "azure-conv"),
                                                  ("burstgpt1_first400.csv", "burstgpt"),
                                                  ("llmservingsim_sharegpt_gpt4_llama31_300req.csv",
                                                   "llmservingsim-sharegpt")])
def test_a_copy_under_another_name_is_read_in_its_format_from_its_columns(kvlab, tmp_path, published, trace):
    """Trial 49: a byte-identical copy of the Azure trace under another name was refused ("header
    'TIMESTAMP,ContextTokens,GeneratedTokens' lacks column prompt_len, output_len")."""
    copy = tmp_path / "copy.csv"
    shutil.copy(SHARED_TRACES / published, copy)
    mine, named = load_workload(str(copy), num_requests=40), load_workload(trace, num_requests=40)
    assert mine.requests == named.requests and mine.name == "copy.csv"
    result = kvlab("run", "vllm", "--workload", copy, "-n", "20", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["workload"]["name"] == "copy.csv"


def test_a_file_under_a_published_name_that_is_not_the_published_file_is_said_so(kvlab, tmp_path):
    """Trial 49: the first 200 lines of the Azure trace, saved as AzureLLMInferenceTrace_conv.csv, ran as
    azure-conv with no word."""
    cut = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    cut.write_text("".join((SHARED_TRACES / "azure2023_conv.csv").read_text().splitlines(keepends=True)[:200]))
    result = kvlab("run", "vllm", "--workload", cut, "-n", "20")
    assert result.exit_code == 0, result.stderr
    size = cut.stat().st_size
    assert (f"note: {cut} goes by a file name of the published azure-conv but is not that file ({size:,} bytes, the "
            f"published file 719,188): it is read in azure-conv's format and labelled AzureLLMInferenceTrace_conv.csv, "
            "not azure-conv") in " ".join(result.stderr.split())
    assert "Workload: AzureLLMInferenceTrace_conv.csv" in " ".join(result.stdout.split())
    whole = tmp_path / "whole" / "AzureLLMInferenceTrace_conv.csv"
    whole.parent.mkdir()
    shutil.copy(SHARED_TRACES / "azure2023_conv.csv", whole)
    result = kvlab("run", "vllm", "--workload", whole, "-n", "20")
    assert result.exit_code == 0 and "note:" not in result.stderr
    assert "Workload: azure-conv" in " ".join(result.stdout.split())
    edited = tmp_path / "edited" / "AzureLLMInferenceTrace_conv.csv"  # the published size, other bytes
    edited.parent.mkdir()
    edited.write_bytes(whole.read_bytes().replace(b",374,44", b",374,45", 1))
    result = kvlab("run", "vllm", "--workload", edited, "-n", "20")
    assert "its checksum differs from the published sha256:" in " ".join(result.stderr.split())


def test_a_bad_azure_timestamp_is_named_with_its_line(kvlab, tmp_path):
    """Trial 49: a malformed TIMESTAMP in an Azure-format copy had no line number ("valid: the file as published")."""
    copy = tmp_path / "mine.csv"
    lines = (SHARED_TRACES / "azure2023_conv.csv").read_text().splitlines(keepends=True)[:6]
    for bad in ("yesterday", ""):  # (an empty cell read as no time at all ran every request at once: trial 50c)
        lines[3] = bad + lines[3][lines[3].index(","):]
        copy.write_text("".join(lines))
        result = kvlab("run", "vllm", "--workload", copy, "-n", "3")
        assert result.exit_code == 2
        assert (f"error: {copy}, line 4: TIMESTAMP {bad!r} is not a date and time; valid: one such as "
                "2023-11-16 18:17:03.9799600, as the published trace writes them") in " ".join(result.stderr.split())


@pytest.mark.parametrize("published", ["azure2023_conv.csv", "burstgpt1_first400.csv"])
def test_rows_out_of_arrival_order_are_run_sorted_and_said_so(kvlab, tmp_path, published):
    """Trial 49: a trace with unsorted arrival times was reordered with no word; the published traces are in order."""
    lines = (SHARED_TRACES / published).read_text().splitlines(keepends=True)[:41]
    swapped = tmp_path / "swapped.csv"
    swapped.write_text("".join([lines[0], lines[2], lines[1], *lines[3:]]))
    mine, ordered = load_workload(str(swapped)), load_workload(trace_for(published, tmp_path, lines))
    assert mine.requests == ordered.requests
    result = kvlab("run", "vllm", "--workload", swapped, "-n", "20")
    assert result.exit_code == 0, result.stderr
    assert ("note: swapped.csv: 1 row arrives earlier than the row before; kvlab runs the requests in arrival order"
            in " ".join(result.stderr.split()))
    assert "note:" not in kvlab("run", "vllm", "--workload", trace_for(published, tmp_path, lines), "-n", "20").stderr


def trace_for(published: str, tmp_path, lines) -> str:
    """The first rows of a published trace, in its order, under a name of the user's."""
    path = tmp_path / f"ordered-{published}"
    path.write_text("".join(lines))
    return str(path)


def test_fetch_of_a_trace_kvlab_traces_dir_already_holds_downloads_nothing(kvlab, monkeypatch, tmp_path):
    """trial58: with the trace in KVLAB_TRACES_DIR, `kvlab workloads fetch` went to the network (and, offline, advised
    setting the variable that was set). It now says where the copy is and whether its checksum is the published one."""
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(SHARED_TRACES / "azure2023_code.csv", folder / "azure2023_code.csv")
    (folder / "azure2023_conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    good = kvlab("workloads", "fetch", "azure-code")
    assert good.exit_code == 0
    assert good.stdout.strip() == (f"azure-code: KVLAB_TRACES_DIR already holds a copy, {folder / 'azure2023_code.csv'} "
                                   "(the published checksum); kvlab reads it from there: nothing to fetch (--force or "
                                   "--from downloads the published file into the cache)")
    other = kvlab("workloads", "fetch", "azure-conv")
    assert other.exit_code == 0 and "(a checksum other than the published " in other.stdout
    assert not (tmp_path / "cache").exists()
