"""Prompts: the configured fixed prompt, or seeded random-word prompts of `live.input_len` tokens.

Random prompts differ per request, so a server's prefix cache cannot turn prefill into a no-op. With a
tokenizer matched to the model the word count is trimmed until the prompt has `input_len` tokens (without
special tokens); without one, one word stands for one token and the summary says so.
"""

from __future__ import annotations

import random

from .tokens import TokenCounter

WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health person "
    "art war history party result change morning reason research girl guy moment air teacher force education "
    "river garden window summer winter music light paper market energy letter table field voice island bridge "
    "mountain forest station engine signal memory circle planet orange silver yellow purple simple quiet "
    "rapid gentle bright distant ancient modern careful narrow steady golden hidden open early final "
    "walk read write build carry follow listen answer travel remember explain measure discover imagine"
).split()


def random_words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


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
