"""Tokens per content chunk, by the best method the server allows (recorded per request).

1. `usage_per_chunk`: every content chunk carries cumulative `usage.completion_tokens`
   (vLLM/SGLang `stream_options.continuous_usage_stats`); a chunk's tokens are the difference.
2. `tokenizer`: a tokenizer matched to the model counts the cumulative text at each content chunk; a chunk's
   tokens are the difference (tokenizing the growing text, not each piece, keeps merges across chunk
   boundaries right). Sources, in order: the configured `live.tokenizer` (a local Hugging Face
   `tokenizer.json` or its directory, read with the `tokenizers` library, as `--tokenizer` in vLLM's bench and
   AIPerf), the server's own tokenize endpoint (llama-cpp-python `/extras/tokenize/count`, llama.cpp and vLLM
   `/tokenize`), then the GGUF's vocabulary through llama-cpp-python when the model is a local GGUF.
3. `usage_total_spread`: only the request's final `usage.completion_tokens` is known. The first chunk counts
   one token (as vLLM's TPOT assumes) and the other tokens are spread evenly over the later chunks; the
   per-token ITLs interpolate the chunk arrival curve, so their mean equals TPOT exactly while their
   distribution is approximate (which chunks held several tokens is unknown).
4. `one_per_chunk`: nothing better is available; each content chunk counts as one token.

Whatever the method, the counts add up to the request's output length: the final `usage.completion_tokens`
when the server sends it (as vLLM bench serve), else the per-chunk sum. Counts from a tokenizer or from usage
per chunk that disagree with the final usage are scaled to it (largest remainder, the first chunk kept) and
the detail says so. Tokens carried by events without text (e.g. held-back partial UTF-8) land on the next
content chunk, the moment a user sees them; a chunk that adds no token (text that completes no token) counts
zero and its gap is carried to the next chunk that does. The first content chunk counts at least one token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

import httpx

from ..errors import ConfigError

from .parse import ParsedStream

USAGE_PER_CHUNK = "usage_per_chunk"
TOKENIZER = "tokenizer"
USAGE_TOTAL_SPREAD = "usage_total_spread"
ONE_PER_CHUNK = "one_per_chunk"
# How far the per-token ITL figures can be trusted, per method (summary `itl_per_token_basis`).
BASIS = {USAGE_PER_CHUNK: "exact", TOKENIZER: "exact", USAGE_TOTAL_SPREAD: "spread", ONE_PER_CHUNK: "per_chunk"}


class TokenCounter(Protocol):
    name: str

    async def count(self, text: str) -> int: ...


class _Cached:
    def __init__(self) -> None:
        self._cache: dict[str, int] = {}

    async def count(self, text: str) -> int:
        if text not in self._cache:
            if len(self._cache) > 20000:
                self._cache.clear()
            self._cache[text] = await self._count(text)
        return self._cache[text]

    async def _count(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


class ServerTokenizer(_Cached):
    """The server's own tokenizer over HTTP (one of the known endpoint shapes)."""

    def __init__(self, client: httpx.AsyncClient, url: str, shape: str, model: str | None, headers: dict[str, str]):
        super().__init__()
        self._client, self._url, self._shape, self._model, self._headers = client, url, shape, model, headers
        path = url.split("//", 1)[-1].split("/", 1)[-1]
        self.name = f"server /{path}"

    def _body(self, text: str) -> dict[str, Any]:
        if self._shape == "llama-cpp-python":
            body: dict[str, Any] = {"input": text}
        else:  # llama.cpp server and vLLM share the path; each ignores the other's keys
            body = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
        if self._model:
            body["model"] = self._model
        return body

    async def _count(self, text: str) -> int:
        resp = await self._client.post(self._url, json=self._body(text), headers=self._headers, timeout=30)
        resp.raise_for_status()
        obj = resp.json()
        if isinstance(obj.get("count"), int):
            return obj["count"]
        if isinstance(obj.get("tokens"), list):
            return len(obj["tokens"])
        raise ValueError("no token count in the answer")


class GGUFTokenizer(_Cached):
    """The GGUF's own vocabulary through llama-cpp-python (vocab only, no weights loaded)."""

    def __init__(self, gguf_path: str):
        super().__init__()
        import llama_cpp  # noqa: PLC0415 - optional dependency

        self._llama = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
        self.name = f"gguf vocabulary ({gguf_path})"

    async def _count(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))


class HFTokenizer(_Cached):
    """A local Hugging Face tokenizer (`tokenizer.json`, or a directory holding one) via the `tokenizers` library."""

    def __init__(self, path: str | os.PathLike):
        where = Path(path).expanduser()
        file = where / "tokenizer.json" if where.is_dir() else where
        if not file.is_file():
            raise ConfigError(f"config field 'live.tokenizer': {file} does not exist (a tokenizer.json file or "
                              "a directory holding one)")
        try:
            from tokenizers import Tokenizer  # noqa: PLC0415 - only needed when the key is set

            self._tok = Tokenizer.from_file(str(file))
        except ImportError:
            raise ConfigError("config field 'live.tokenizer': the tokenizers package is not installed "
                              "(pip install tokenizers)") from None
        except Exception as exc:  # tokenizers raises its own Exception type for unreadable files
            raise ConfigError(f"config field 'live.tokenizer': cannot read {file} as a Hugging Face tokenizer "
                              f"({' '.join(str(exc).split())[:160]})") from None
        super().__init__()
        self.name = f"live.tokenizer ({file})"

    async def _count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


async def find_server_tokenizer(
    client: httpx.AsyncClient, root: str, model: str | None, headers: dict[str, str]
) -> ServerTokenizer | None:
    """Probe the tokenize endpoints a server may offer; the first that counts a test string wins."""
    for path, shape in (("/extras/tokenize/count", "llama-cpp-python"), ("/tokenize", "llama.cpp/vllm")):
        tok = ServerTokenizer(client, root.rstrip("/") + path, shape, model, headers)
        try:
            n = await tok.count("Hello world, this is a token count probe.")
            base = await tok.count("")
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            continue
        if isinstance(n, int) and n > base >= 0:
            return tok
    return None


def chunk_tokens_from_cumulative(cumulative: list[int]) -> list[int]:
    """Per-chunk tokens from cumulative counts at each content chunk (a count that dips or stalls adds zero;
    the first chunk counts at least one)."""
    out, prev = [], 0
    for cum in cumulative:
        k = max(0 if out else 1, cum - prev)
        out.append(k)
        prev += k
    return out


def apportion(weights: list[float], total: int) -> list[int]:
    """`total` split into integers proportional to `weights` (largest remainder; ties go to later items)."""
    if not weights or total <= 0:
        return [0] * len(weights)
    w = [max(0.0, float(x)) for x in weights]
    if sum(w) <= 0:
        w = [1.0] * len(w)
    exact = [total * x / sum(w) for x in w]
    out = [int(x) for x in exact]
    order = sorted(range(len(w)), key=lambda i: (exact[i] - out[i], i), reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def fit_to_total(counts: list[int], total: int) -> list[int]:
    """Counts rescaled so they add up to `total`: the first chunk keeps its count, the rest is apportioned."""
    if not counts:
        return counts
    first = max(1, min(counts[0], total - (1 if len(counts) > 1 and total > 1 else 0)))
    return [first, *apportion(counts[1:], max(0, total - first))]


def spread_total(n_chunks: int, total: int) -> list[int]:
    """`usage_total_spread`: one token for the first chunk, the rest as even as integers allow."""
    if n_chunks == 0:
        return []
    if n_chunks == 1:
        return [max(1, total)]
    return [1, *apportion([1.0] * (n_chunks - 1), max(0, total - 1))]


def usage_total(parsed: ParsedStream) -> int | None:
    """The final `usage.completion_tokens`, when the server sent one."""
    total = (parsed.usage or {}).get("completion_tokens")
    return int(total) if isinstance(total, (int, float)) and total > 0 else None


async def count_chunk_tokens(parsed: ParsedStream, counter: TokenCounter | None) -> tuple[list[int], str, str]:
    """Tokens per content chunk, the method used, and the method's detail (sums to the final usage if sent)."""
    chunks = parsed.chunks
    total = usage_total(parsed)
    counts: list[int] | None = None
    if chunks and all(c.cum_tokens is not None for c in chunks):
        counts = chunk_tokens_from_cumulative([int(c.cum_tokens) for c in chunks])
        method, detail = USAGE_PER_CHUNK, "server usage per chunk"
    elif counter is not None:
        try:
            base = await counter.count("")
            cumulative, prefix = [], ""
            for c in chunks:
                prefix += c.text
                cumulative.append(await counter.count(prefix) - base)
            counts = chunk_tokens_from_cumulative(cumulative)
            method, detail = TOKENIZER, counter.name
        except (httpx.HTTPError, ValueError, RuntimeError, TypeError, json.JSONDecodeError):
            counts = None
    if counts is not None:
        if total is not None and sum(counts) != total:
            detail += f" (counted {sum(counts)}, scaled to the final usage total {total})"
            counts = fit_to_total(counts, total)
        return counts, method, detail
    if total is not None:
        return (spread_total(len(chunks), total), USAGE_TOTAL_SPREAD,
                "final usage total spread over the chunks after the first (per-token distribution approximate)")
    return [1] * len(chunks), ONE_PER_CHUNK, "no usage and no tokenizer: one token per content chunk"


def output_tokens(parsed: ParsedStream, chunk_tokens: list[int]) -> tuple[int, str]:
    """The request's output length: final usage (as vLLM bench serve does) or the per-chunk sum."""
    total = usage_total(parsed)
    if total is not None:
        return total, "usage"
    return int(sum(chunk_tokens)), "per_chunk_sum"
