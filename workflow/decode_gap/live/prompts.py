"""Prompts: the configured fixed prompt, or seeded random-word prompts of `live.input_len` tokens.

Random prompts differ per request, so a server's prefix cache cannot turn prefill into a no-op. With a
tokenizer matched to the model the word count is trimmed until the prompt has `input_len` tokens (without
special tokens); without one, one word stands for one token and the summary says so.
"""

from __future__ import annotations

from ..prompts import WORDS, random_words  # noqa: F401  (the core word list; re-exported for the stage)
from .tokens import TokenCounter


async def build_prompt(input_len: int, seed: int, counter: TokenCounter | None) -> tuple[str, int | None]:
    """A prompt of about `input_len` tokens and its token count (None when no tokenizer counted it)."""
    if counter is None:
        return random_words(input_len, seed), None
    base = await counter.count("")
    words = random_words(input_len, seed).split()
    n = await counter.count(" ".join(words)) - base
    while n > input_len and len(words) > 1:
        words.pop()
        n = await counter.count(" ".join(words)) - base
    extra = 0
    while n < input_len and extra < 4 * input_len:
        extra += 1
        words.append(random_words(1, seed * 7919 + extra))
        m = await counter.count(" ".join(words)) - base
        if m > input_len:
            words.pop()
            break
        n = m
    return " ".join(words), n
