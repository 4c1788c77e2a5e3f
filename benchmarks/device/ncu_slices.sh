# ncu on the sliced NVFP4 GEMV forms (slices_probe.py's CFGS): issue rate, DRAM throughput and occupancy per form.
# Device: run(command="bash benchmarks/device/ncu_slices.sh"); ncu's own clocks left alone (--clock-control none).
export PYTHONPATH=workflow
for spec in "7168 18432 1" "7168 18432 8" "7168 18432 6" "28672 4096 1"; do
  echo "=== $spec"
  timeout 100 ncu --clock-control none -k regex:fp4_mma -s 2 -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats python3 benchmarks/device/slices_probe.py one $spec 2>&1 | grep -E "triton nvfp4|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Eligible Warps|Active Warps Per|Registers Per|Grid Size|Waves Per SM|ERR|Error" | head -40
done
