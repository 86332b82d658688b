"""``kvlab workloads fetch NAME``: a published trace downloaded from its publisher's address into the cache.

The download goes to a temporary file beside its destination; only a file whose checksum is the published one is
renamed into place, so the cache never holds half a file or someone else's bytes. The network is touched here and
nowhere else in kvlab.workload.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.workload.published import TRACES, PublishedTrace, cache_dir

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 30.0


def file_checksum(path: Path, kind: str) -> str:
    """``kind:HEX`` of a file: ``sha256`` of its bytes, or ``git-blob-sha1`` (SHA-1 of ``blob SIZE\\0`` + bytes,
    the id git gives the file)."""
    if kind == "sha256":
        digest = hashlib.sha256()
    elif kind == "git-blob-sha1":
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(f"blob {path.stat().st_size}\0".encode())
    else:
        raise ValueError(f"unknown checksum kind {kind!r}")
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return f"{kind}:{digest.hexdigest()}"


def matches_checksum(path: Path, checksum: str) -> bool:
    return file_checksum(path, checksum.split(":", 1)[0]) == checksum


def differs_from_published(trace: PublishedTrace, path: Path) -> str | None:
    """One line when a file that goes by one of ``trace``'s names is not the published file (its size, else its
    checksum, differs: a subset, or a copy edited or cut short); None when it is the published file."""
    size = path.stat().st_size
    if trace.size_bytes is not None and size != trace.size_bytes:
        how = f"{size:,} bytes, the published file {trace.size_bytes:,}"
    elif not matches_checksum(path, trace.checksum):
        how = f"its checksum differs from the published {trace.checksum}"
    else:
        return None
    return (f"{path} goes by a file name of the published {trace.name} but is not that file ({how}): it is read in "
            f"{trace.name}'s format and labelled {path.name}, not {trace.name}")


def fetched(name: str, destination: Path | None = None) -> Path | None:
    """The copy of trace ``name`` a fetch already saved, if it is there with the published checksum."""
    trace = TRACES[name]
    path = (destination if destination is not None else cache_dir()) / trace.filename
    return path if path.is_file() and matches_checksum(path, trace.checksum) else None


def source_address(name: str, url: str | None) -> str:
    """Where trace ``name`` is fetched from: ``url`` (a mirror), which must be an http(s) address, or its publisher's."""
    if url is None:
        return TRACES[name].url
    if not url.startswith(("http://", "https://")):
        raise KvlabError(f"--from {url!r} is not an http(s) address; for a file on this machine, give its path as "
                         f"--workload (named {TRACES[name].filename}) or put it in a folder named by KVLAB_TRACES_DIR")
    return url


def fetch(
    name: str,
    url: str | None = None,
    destination: Path | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> Path:
    """Downloads trace ``name`` (from ``url``, a mirror, or else its published address), checks its checksum and
    saves it in ``destination`` (default: the cache folder) under its published file name; returns the path.

    ``progress(bytes_so_far, total_or_None)`` is called as the bytes arrive. A KvlabError, with nothing saved,
    when the name is unknown, the server cannot be reached or answers an error, or the checksum differs."""
    import httpx

    if name not in TRACES:
        raise KvlabError(f"unknown trace {name!r}; valid: {', '.join(TRACES)}")
    trace: PublishedTrace = TRACES[name]
    source = source_address(name, url)
    folder = destination if destination is not None else cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{trace.filename}.", suffix=".part", dir=folder)
    except OSError as error:
        raise KvlabError(f"cannot write in the folder {folder} for {name} ({error.strerror}); set KVLAB_CACHE_DIR to "
                         "a folder you can write in") from None
    target = folder / trace.filename
    part = Path(temporary)
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                with httpx.stream("GET", source, follow_redirects=True, timeout=TIMEOUT_S) as response:
                    if response.status_code != 200:
                        advice = ("check the address" if 400 <= response.status_code < 500 else "try again later")
                        raise KvlabError(f"could not download {name}: {source} answered HTTP {response.status_code}; "
                                         f"{advice}, or download the file yourself and set KVLAB_TRACES_DIR")
                    total = int(response.headers["content-length"]) if "content-length" in response.headers else None
                    done = 0
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        out.write(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
            except httpx.HTTPError as error:
                reason = str(error) or type(error).__name__
                raise KvlabError(f"could not download {name} from {source} ({reason}); check the connection, or "
                                 "download the file yourself and set KVLAB_TRACES_DIR to its folder") from None
        got = file_checksum(part, trace.checksum.split(":", 1)[0])
        if got != trace.checksum:
            raise KvlabError(f"the file downloaded from {source} is not the published {name}: its checksum is {got}, "
                             f"the published one {trace.checksum}; nothing was saved")
        umask = os.umask(0)
        os.umask(umask)
        part.chmod(0o666 & ~umask)  # mkstemp's 0600 is for the half-written file; the trace is an ordinary file
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return target
