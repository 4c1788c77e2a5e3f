"""`python -m decode_gap.simulate.kernel_rank <job.json> <rank>`: one rank of the kernel-level step at TP > 1."""

from ..ranks import rank_main
from .kernel import rank_body

if __name__ == "__main__":
    raise SystemExit(rank_main(rank_body))
