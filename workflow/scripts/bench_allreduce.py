# Micro-benchmark 'allreduce' at the model's per-GPU shapes -> microbench/allreduce.csv and allreduce.json.
# With microbench.allreduce.nodes > 1 (a SLURM job over several nodes) the ranks' job.json and result files
# go to microbench/allreduce.ranks/, next to the outputs on the shared filesystem.
import copy
from pathlib import Path

from decode_gap.fleet import allreduce_layout
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    config = snakemake.config
    if allreduce_layout(config).multinode:
        config = copy.deepcopy(dict(config))
        mb = config.setdefault("microbench", {})
        mb["allreduce"] = {**(mb.get("allreduce") or {}),
                           "work_dir": str(Path(snakemake.output.json).parent / "allreduce.ranks")}
    run_stage("allreduce", config, snakemake.output.csv, snakemake.output.json, memory_json=None)


run_script(snakemake, body, measures=True)
