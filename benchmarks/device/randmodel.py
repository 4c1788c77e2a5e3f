"""Benchmark tool: build a random-weight Hugging Face model directory (config, safetensors, tokenizer with a
chat template). Not part of the pipeline (only the device benchmarks use it):
`python3 benchmarks/device/randmodel.py CONFIG.json OUT_DIR [--dtype bfloat16] [--seed 0]`.

Timing does not depend on weight values, so a server can be measured on a model of the right shapes without
downloading anything. The tokenizer is a word-level one built with the `tokenizers` library, one word per id of the model's vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def build_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """A word-level tokenizer with exactly `vocab_size` entries, so every id a random model samples decodes to
    text (a BPE trained on a small corpus would leave most ids without text, and a server would stream nothing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def build_random_model(config_json: str | Path, out_dir: str | Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write a random-weight model for `config_json` (a Hugging Face config.json) into `out_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = AutoConfig.from_pretrained(str(config_json))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(str(out))
    build_tokenizer(out, cfg.vocab_size)
    meta = {"source_config": str(config_json), "weights": "random (torch.manual_seed)", "seed": seed, "dtype": dtype}
    (out / "decode_gap_random_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Write a random-weight model for a Hugging Face config.json.")
    ap.add_argument("config_json")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(build_random_model(a.config_json, a.out_dir, a.dtype, a.seed))
