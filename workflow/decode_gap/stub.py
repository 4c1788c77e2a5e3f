"""Temporary: a stage that is not built yet writes a 'skipped' summary (never a fake number)."""

from pathlib import Path

import pandas as pd

from .io import write_json, write_table
from .provenance import skipped_stage


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
