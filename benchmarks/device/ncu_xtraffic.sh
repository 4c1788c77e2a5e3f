# ncu on the M=16 NVFP4 GEMV with x's rows distinct and with one row (xtraffic_probe.py): stall reasons and
# instructions. Device: run(command="bash benchmarks/device/ncu_xtraffic.sh"); --clock-control none (METHOD.md).
export PYTHONPATH=workflow
M=smsp__average_warps_issue_stalled
METRICS=l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_active
# how busy the tensor, integer and fp32 pipes and DRAM were (at M = 9-16 a decoded tile feeds two MMAs)
METRICS=$METRICS,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
METRICS=$METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed
for r in long_scoreboard short_scoreboard math_pipe_throttle mio_throttle lg_throttle wait not_selected selected \
         dispatch_stall barrier no_instructions tex_throttle drain branch_resolving; do
  METRICS=$METRICS,${M}_${r}_per_issue_active.ratio
done
# the calls named as arguments (N K M FORM [shared], FORM a key of xtraffic_probe.CFGS), else these
[ $# -gt 0 ] || set -- "28672 4096 16 xj" "28672 4096 16 xj shared" "28672 4096 16 xs" "28672 4096 8 bx" \
  "28672 4096 1 bx"
for spec in "$@"; do
  echo "=== $spec"
  timeout 100 ncu --clock-control none -k regex:fp4_mma -s 2 -c 1 --metrics $METRICS \
      python3 benchmarks/device/xtraffic_probe.py one $spec 2>&1 \
    | grep -E "triton nvfp4|smsp__|sm__|l1tex__|lts__|gpu__|dram__|ERR|Error" \
    | sed 's/smsp__average_warps_issue_stalled_//' | head -40
done
