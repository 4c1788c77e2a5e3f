"""Tokens per content chunk, by the best method the server allows (recorded per request).

1. `usage_per_chunk`: every content chunk carries cumulative `usage.completion_tokens`
   (vLLM/SGLang `stream_options.continuous_usage_stats`); a chunk's tokens are the difference.
2. `tokenizer`: a tokenizer matched to the model counts the cumulative text at each content chunk; a chunk's
   tokens are the difference (tokenizing the growing text, not each piece, keeps merges across chunk
   boundaries right). Sources, in order: the server's own tokenize endpoint (llama-cpp-python
   `/extras/tokenize/count`, llama.cpp and vLLM `/tokenize`), then the GGUF's vocabulary through
   llama-cpp-python when the model is a local GGUF.
3. `one_per_chunk`: nothing better is available; each content chunk counts as one token.

Tokens carried by events without text (e.g. held-back partial UTF-8) land on the next content chunk, the
moment a user sees them. A content chunk always counts at least one token. The request's output length
(TPOT, throughput) is the final `usage.completion_tokens` when the server sends it, as in vLLM, else the
sum over chunks.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from .parse import ParsedStream

USAGE_PER_CHUNK = "usage_per_chunk"
TOKENIZER = "tokenizer"
ONE_PER_CHUNK = "one_per_chunk"


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
    """Per-chunk tokens from cumulative counts at each content chunk (at least one per chunk)."""
    out, prev = [], 0
    for cum in cumulative:
        out.append(max(1, cum - prev))
        prev = max(prev, cum)
    return out


async def count_chunk_tokens(parsed: ParsedStream, counter: TokenCounter | None) -> tuple[list[int], str, str]:
    """Tokens per content chunk, the method used, and the method's detail."""
    chunks = parsed.chunks
    if chunks and all(c.cum_tokens is not None for c in chunks):
        return chunk_tokens_from_cumulative([int(c.cum_tokens) for c in chunks]), USAGE_PER_CHUNK, "server usage per chunk"
    if counter is not None:
        try:
            base = await counter.count("")
            cumulative, prefix = [], ""
            for c in chunks:
                prefix += c.text
                cumulative.append(await counter.count(prefix) - base)
            return chunk_tokens_from_cumulative(cumulative), TOKENIZER, counter.name
        except (httpx.HTTPError, ValueError, RuntimeError):
            pass
    return [1] * len(chunks), ONE_PER_CHUNK, "no usage per chunk and no tokenizer: one token per content chunk"


def output_tokens(parsed: ParsedStream, chunk_tokens: list[int]) -> tuple[int, str]:
    """The request's output length: final usage (as vLLM bench serve does) or the per-chunk sum."""
    usage = parsed.usage or {}
    total = usage.get("completion_tokens")
    if isinstance(total, (int, float)) and total > 0:
        return int(total), "usage"
    return int(sum(chunk_tokens)), "per_chunk_sum"
