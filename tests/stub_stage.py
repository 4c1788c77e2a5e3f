"""Test double for test_reruns.py: a stage script that writes a 'skipped' summary for every output (never a fake
number) and a one-line log. Its source is written into the copied repository's stage scripts, so it imports only
the package's core (io, provenance)."""

from pathlib import Path

import pandas as pd

from decode_gap.io import write_json, write_table
from decode_gap.provenance import skipped_stage


def write_stub(snakemake) -> None:
    for path in snakemake.output:
        p = Path(path)
        if p.suffix == ".json":
            write_json(p, skipped_stage(snakemake.rule, "not implemented yet"))
        elif p.suffix in (".csv", ".parquet"):
            write_table(p, pd.DataFrame())
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("not implemented yet\n")
    for path in snakemake.log:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("stub\n")
