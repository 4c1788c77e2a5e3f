# ncu on the NVFP4 GEMV's loop with its DRAM traffic taken away (ablate_probe.py --profile L2) and as it runs
# (base): stall reasons, instructions and pipes, at M = 1, 8 and 16 (the plan's forms), to see what M = 9-16's loop
# spends beyond M = 8's with no memory in the way. Device: run(command="bash benchmarks/device/ncu_ablate.sh");
# --clock-control none as ncu_xtraffic.sh. Arguments: "NxK M FORM WAY" specs, else the ones below.
export PYTHONPATH=workflow
M=smsp__average_warps_issue_stalled
METRICS=gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg
METRICS=$METRICS,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active
METRICS=$METRICS,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
METRICS=$METRICS,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
METRICS=$METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed
for r in long_scoreboard short_scoreboard math_pipe_throttle mio_throttle lg_throttle wait not_selected selected \
         dispatch_stall barrier no_instructions drain branch_resolving; do
  METRICS=$METRICS,${M}_${r}_per_issue_active.ratio
done
[ $# -gt 0 ] || set -- "28672x4096 16 plan L2" "28672x4096 8 plan L2" "28672x4096 1 plan L2" "28672x4096 16 plan base" \
  "28672x4096 8 plan base"
for spec in "$@"; do
  set -- $spec
  echo "=== $spec"
  timeout 100 ncu --clock-control none -k regex:fp4_mma -s 2 -c 1 --metrics $METRICS \
      python3 benchmarks/device/ablate_probe.py --profile "$4" --shapes "$1" --m "$2" --forms "$3" 2>&1 \
    | grep -E "fp4_mma|smsp__|sm__|l1tex__|gpu__|dram__|ERR|Error" \
    | sed 's/smsp__average_warps_issue_stalled_//' | head -40
done
