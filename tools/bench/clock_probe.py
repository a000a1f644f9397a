import math, subprocess, time, torch, triton, kjit
E, K, N, M = 32, 7168, 4096, 8192
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = (torch.randn(E, N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
ends = torch.cumsum(torch.bincount(torch.randint(0, E, (M,), device="cuda"), minlength=E), 0).to(torch.int32)
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
wt = w.transpose(1, 2)
fns = {"kjit": lambda: kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out),
       "torch": lambda: torch._grouped_mm(a, wt, offs=ends)}
for f in fns.values(): f()
torch.cuda.synchronize()
for rnd in range(3):
    for name, f in fns.items():
        mon = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        t = triton.testing.do_bench(f, warmup=200, rep=1500, return_mode="median")
        mon.terminate(); samples = mon.communicate()[0].split("\n")
        vals = [tuple(float(x) for x in s.split(",")) for s in samples if s.strip()]
        tail = vals[len(vals)//2:]
        print(f"{name:6s} {t*1e3:8.1f} us  sm clock {sum(v[0] for v in tail)/len(tail):6.0f} MHz  power {sum(v[1] for v in tail)/len(tail):5.0f} W  ({len(vals)} samples)")
    # short bursts: 20 launches after idle
    for name, f in fns.items():
        time.sleep(1.0)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); [f() for _ in range(5)]; e.record(); e.synchronize()
        print(f"{name:6s} burst of 5 after 1 s idle: {s.elapsed_time(e)/5*1e3:8.1f} us")
