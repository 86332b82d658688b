"""What kvlab can learn about a server before sending it any load.

    GET /v1/models   OpenAI-compatible?  which model, and (vLLM) its max_model_len and where it was loaded from
    GET /version     vLLM's version, when /v1/models says "owned_by": "vllm" or /metrics is vLLM's: then
                     prompts go as token ids, with ignore_eos
    GET /metrics     Prometheus text; vLLM's has vllm:* series and vllm:cache_config_info (block_size,
                     num_gpu_blocks, ...)

A server that cannot be reached or is not OpenAI-compatible stops the bench before any load is sent
(KvlabError); a missing or foreign /metrics only removes the server-side series, and ``notes`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.errors import KvlabError

API_KEY_VARS = ("KVLAB_API_KEY", "OPENAI_API_KEY")


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``url``'s userinfo (``http://user:secret@host``, or without a scheme as a user may mistype
    it: ``user:secret@host``, ``//user:secret@host``) is, as (start, end); None where it has none."""
    _, sep, rest = url.partition("://")
    start = len(url) - len(rest) if sep else 0
    start += len(url[start:]) - len(url[start:].lstrip("/"))  # (//user:secret@host)
    authority = url[start:]
    authority = authority[:min((i for i in (authority.find(c) for c in "/?#") if i >= 0), default=len(authority))]
    userinfo, at, _ = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return None
    colon = start + userinfo.index(":")
    return colon + 1, start + len(userinfo)


def shown_url(url: str) -> str:
    """``url`` as kvlab prints and stores it: a password in it (``http://user:secret@host``) becomes ``***``."""
    span = _password_span(url)
    return url if span is None else f"{url[:span[0]]}***{url[span[1]:]}"


def hide_password(text: str, url: str) -> str:
    """``text`` (an error of httpx's, which may quote the URL) with the password of ``url`` replaced by ``***``."""
    span = _password_span(url)
    if span is None:
        return text
    start = url.rfind("/", 0, span[0]) + 1  # (the userinfo's start: after the scheme's //, or the URL's)
    return text.replace(url[start:span[1]] + "@", url[start:span[0]] + "***@")


@dataclass(frozen=True)
class ServerInfo:
    url: str  # base URL, without /v1
    model: str  # the served model name requests are sent to
    model_root: str | None = None  # vLLM: the path or Hugging Face id the server loaded
    max_model_len: int | None = None
    vllm_version: str | None = None
    has_metrics: bool = False  # /metrics answers with Prometheus text
    has_vllm_metrics: bool = False  # ... and it holds vLLM's series
    cache_config: dict = field(default_factory=dict)  # labels of vllm:cache_config_info
    notes: tuple[str, ...] = ()  # what could not be read, and what the bench does without it

    @property
    def shown_url(self) -> str:
        """The URL as printed and stored: its password, if any, as ``***``."""
        return shown_url(self.url)

    @property
    def is_vllm(self) -> bool:
        return self.vllm_version is not None or self.has_vllm_metrics

    def to_json(self) -> dict:
        """``server`` in the summary: the URL, the model and what was read of the server's configuration."""
        config = self.cache_config
        return {
            "url": self.shown_url,
            "model": self.model,
            "model_root": self.model_root,
            "vllm_version": self.vllm_version,
            "block_size": config.get("block_size"),
            "num_gpu_blocks": config.get("num_gpu_blocks"),
            "kv_cache_size_tokens": config.get("kv_cache_size_tokens"),
            "enable_prefix_caching": config.get("enable_prefix_caching"),
            "max_model_len": self.max_model_len,
            "has_metrics": self.has_metrics,
            "has_vllm_metrics": self.has_vllm_metrics,
            "cache_config": config,
            "notes": list(self.notes),
        }


def base_url(url: str) -> str:
    """The server's root: ``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/v1`` are one."""
    import httpx

    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("http", "https"):  # (a scheme is case-insensitive: HTTP://HOST is http://HOST)
        url = f"{scheme.lower()}://{rest}"
    if not url.startswith(("http://", "https://")):
        raise KvlabError(f"--url {shown_url(url)!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)")
    valid = "valid: an http:// or https:// URL such as http://127.0.0.1:8000"
    if any(c.isspace() for c in url):
        raise KvlabError(f"--url {shown_url(url)!r} has a space in it; {valid}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:  # ('Invalid port: ...', 'Invalid IPv6 address: ...')
        said = hide_password(str(exc), url)
        raise KvlabError(f"--url {shown_url(url)!r}: {said[:1].lower()}{said[1:].rstrip('.')}; {valid}") from None
    if not parsed.host:
        raise KvlabError(f"--url {shown_url(url)!r} names no host; {valid}")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise KvlabError(f"--url {shown_url(url)!r}: port {parsed.port} is out of range; valid: a port from 1 to 65535, as in "
                         "http://127.0.0.1:8000")
    return url.removesuffix("/v1")


def api_key_from_env(environ) -> str | None:
    """The first of KVLAB_API_KEY, OPENAI_API_KEY that is set (sent as a Bearer token, never printed)."""
    for name in API_KEY_VARS:
        if environ.get(name):
            return environ[name]
    return None


def _models(client, url: str) -> list[dict]:
    import httpx

    try:
        response = client.get("/v1/models")
    except httpx.HTTPError as exc:
        said = hide_password(str(exc), str(client.base_url))
        detail = f"{type(exc).__name__}: {said.rstrip('.') or 'no answer'}"
        if isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            # (reached: something took the connection, and closed it or answered in something other than HTTP)
            raise KvlabError(f"{url} took the connection but gave no HTTP answer to GET /v1/models ({detail}): is an "
                             "OpenAI-compatible server listening on that port? Nothing was sent.") from exc
        raise KvlabError(f"cannot reach {url}: {detail}. Is the server running there? Nothing was sent.") from exc
    if response.status_code in (401, 403):
        raise KvlabError(f"{url} refused the API key (HTTP {response.status_code} on /v1/models): set "
                         f"{' or '.join(API_KEY_VARS)} to the server's key. Nothing was sent.")
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
        what = f"HTTP {response.status_code}" if response.status_code != 200 else "no OpenAI model list"
        raise KvlabError(f"{url} is not an OpenAI-compatible server: GET /v1/models gave {what} "
                         f"({response.text[:80]!r}); kvlab bench needs /v1/models and /v1/completions. "
                         "Nothing was sent.")
    if not data:
        raise KvlabError(f"{url} serves no model (GET /v1/models is empty). Nothing was sent.")
    return data


def _pick_model(data: list[dict], model: str | None, url: str) -> dict:
    if model is None:
        return data[0]
    for entry in data:
        if entry["id"] == model:
            return entry
    served = ", ".join(repr(m["id"]) for m in data)
    raise KvlabError(f"--model {model!r} is not served by {url}; it serves {served}. Nothing was sent.")


def _vllm_version(client) -> str | None:
    import httpx

    try:
        response = client.get("/version")
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return version if isinstance(version, str) else None


def _metrics(client, url: str) -> tuple[bool, bool, dict, list[str]]:
    """(has_metrics, has_vllm_metrics, cache_config, notes)."""
    import httpx

    from kvlab.bench.scrape import is_vllm_metrics, parse_metrics, read_cache_config

    without = "measuring the client side only (no KV cache usage, queue or preemption series from the server)"
    try:
        response = client.get("/metrics")
    except httpx.HTTPError as exc:
        return False, False, {}, [f"{url}/metrics did not answer ({type(exc).__name__}): {without}"]
    if response.status_code != 200:
        return False, False, {}, [f"{url} has no /metrics (HTTP {response.status_code}): {without}"]
    try:
        values = parse_metrics(response.text)
        cache_config = read_cache_config(response.text) or {}
    except ValueError:
        return False, False, {}, [f"{url}/metrics is not Prometheus text: {without}"]
    if not is_vllm_metrics(values):
        return True, False, {}, [(f"{url}/metrics is not vLLM's (no vllm:num_requests_running, "
                                 f"vllm:kv_cache_usage_perc): {without}; its series are still recorded")]
    notes = [] if cache_config else [(f"{url}/metrics has no vllm:cache_config_info: the server's block size and "
                                     "block count are unknown")]
    return True, True, cache_config, notes


def probe(url: str, *, model: str | None = None, api_key: str | None = None, timeout: float = 10.0) -> ServerInfo:
    """Everything the bench needs to know about ``url`` before it sends load; raises KvlabError if it cannot
    send any (unreachable, not OpenAI-compatible, the key refused, the model not served)."""
    import httpx

    try:
        import prometheus_client  # noqa: F401 — the /metrics parser, an optional dependency
    except ModuleNotFoundError as exc:
        raise KvlabError("kvlab bench reads /metrics with prometheus-client, which is not installed: "
                         "pip install prometheus-client (kvlab's own dependency: reinstall kvlab)") from exc
    url = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        shown = shown_url(url)  # (in messages: the password, if the URL has one, as ***)
        entry = _pick_model(_models(client, shown), model, shown)
        has_metrics, has_vllm_metrics, cache_config, notes = _metrics(client, shown)
        # Other servers answer /version too (SGLang does): only vLLM's model list says "owned_by": "vllm".
        version = _vllm_version(client) if has_vllm_metrics or entry.get("owned_by") == "vllm" else None
    max_model_len = entry.get("max_model_len")
    return ServerInfo(
        url=url,
        model=entry["id"],
        model_root=entry.get("root") if isinstance(entry.get("root"), str) else None,
        max_model_len=max_model_len if isinstance(max_model_len, int) else None,
        vllm_version=version,
        has_metrics=has_metrics,
        has_vllm_metrics=has_vllm_metrics,
        cache_config=cache_config,
        notes=tuple(notes),
    )
