"""Seeded random-word prompts, shared by the stages that send prompts (live, simulate).

Random prompts differ per request, so a server's prefix cache cannot turn prefill into a no-op. One word
stands for about one token; callers with a tokenizer trim to an exact token count (live.prompts).
"""

from __future__ import annotations

import random

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
    """`n` (at least one) words drawn with a private RNG seeded by `seed`: the same call gives the same prompt."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))
