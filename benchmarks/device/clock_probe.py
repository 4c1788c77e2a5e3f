"""Does the NVFP4 lm_head GEMV slow down under sustained load, and why? (H200, one device call, about a minute)

    PYTHONPATH=workflow python3 benchmarks/device/clock_probe.py

Times GLM-5's lm_head (154880x6144) in the fp16 4-step tensor-core form by CUDA-graph replay, three times cold, after
40 s of a bf16 GEMV load and after 5 s idle, printing NVML's SM and memory clocks, power, temperature and clock
throttle reasons (0x4: software power cap) after each. On the H200 the replays that followed one another held the SM
clock at 1740-1755 MHz under the power cap (646-658 W) and took 145-147 us, against 139-142 us at 1980 MHz.
"""
import sys, time, torch, pynvml
sys.path.insert(0, "workflow")
from decode_gap.kernels import lowprec as lp, nvfp4 as nv
from decode_gap.microbench.timing import time_graph
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
def clk():
    return (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000), pynvml.nvmlDeviceGetTemperature(h, 0),
            hex(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
dev = "cuda"
w = torch.randn(154880, 6144, device=dev, dtype=torch.bfloat16)
q = nv.quantize_nvfp4(w); del w
qs = [q, nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)]
x = torch.randn(1, 6144, device=dev).to(torch.bfloat16)
gs = [lp.Nvfp4Gemv(qq, 1, dev, lp.FP4_MMA_WIDE) for qq in qs]
fns = [(lambda g=g: g(x)) for g in gs]
def lm(tag):
    for rep in range(3):
        s = time_graph(fns, 5, 30, dev)
        print(f"{tag} rep{rep}: median {s.median_us:.1f} min {s.min_us:.1f} p99 {s.p99_us:.1f} us  clocks(sm,mem,W,C,thr) {clk()}", flush=True)
lm("cold")
big = torch.randn(16384, 65536, device=dev, dtype=torch.bfloat16)  # 2 GiB
v = torch.randn(65536, 1, device=dev, dtype=torch.bfloat16)
t0 = time.time(); n = 0
while time.time() - t0 < 40:
    for _ in range(50):
        torch.mm(big, v)
    torch.cuda.synchronize(); n += 1
    if n % 40 == 0:
        print(f"load {time.time()-t0:.0f}s clocks {clk()}", flush=True)
lm("after 40 s of bf16 GEMV load")
del big
time.sleep(5)
lm("after 5 s idle")
