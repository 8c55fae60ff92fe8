import os, sys, time, json, statistics
os.environ["ISAN_CACHE_DIR"] = "/tmp/isan-cache-tune"
from isan.engine.kernels import _native as nat, autotune_kernels, native_status
from isan.engine.kernels.autotune import cpu_model
out = {"cpu": cpu_model(), "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
t0 = time.perf_counter(); s = autotune_kernels(); out["autotune_s"] = time.perf_counter() - t0
out["autotune"] = s
print("AUTOTUNE", round(out["autotune_s"], 3), s["variant"], s["how"], {k: (round(v["gflops"]), round(v["gflops_grouped_step"]), round(v["gflops_jumps_like"])) for k, v in s["timings"].items()}, flush=True)
s2 = autotune_kernels(force=True)
print("AUTOTUNE2", s2["variant"], {k: round(v["gflops"]) for k, v in s2["timings"].items()}, flush=True)
out["autotune2"] = s2
pk = {}
for th in (1, 16):
    vals = []
    for _ in range(3):
        fl, secs, used, _ = nat.fma_peak(20_000_000, th); vals.append(fl / secs / 1e9)
    pk[th] = statistics.median(vals)
print("PEAK", pk, flush=True)
out["peak"] = pk
from isan.engine import Engine, default_model_path
from isan.data import read_text8_split
eng = Engine.load(default_model_path())
text = read_text8_split(os.environ["TEXT8"], "unseen")
eng.jump_table()
vs = [v[0] for v in nat.variants() if v[1] == "avx512"]
FL = 2.0 * (eng.d + 1) * (eng.d + eng.params.V)
res = {}
for th, n, reps in ((1, int(os.environ.get("N1", 600_000)), 3), (16, int(os.environ.get("N16", 2_500_000)), 3)):
    ids = eng.encode(text[:n])
    for p in ("jumps", "chunked"):
        t = {v: [] for v in vs}
        for v in vs:
            nat.set_isa(v); eng.score(ids, normalize="none", threads=th, path=p)
        for _ in range(reps):
            for v in vs:
                nat.set_isa(v)
                t0 = time.perf_counter(); eng.score(ids, normalize="none", threads=th, path=p); t[v].append(time.perf_counter() - t0)
        for v in vs:
            cps = n / min(t[v]); res[f"{th}t {p} {v}"] = cps
            print(f"AB threads={th} path={p} {v}: {cps/1e6:.3f}M chars/s, {cps*FL/1e9:.0f} GFLOP/s = {cps*FL/1e9/pk[th]:.0%} of peak", flush=True)
nat.set_isa(s["variant"])
ids = eng.encode(text[:int(os.environ.get("N16", 2_500_000))])
for p in ("jumps", "chunked"):
    t = {"0": [], "1": []}
    for pin in ("0", "1"):
        os.environ["ISAN_PIN_THREADS"] = pin; eng.score(ids, normalize="none", threads=16, path=p)
    for _ in range(3):
        for pin in ("0", "1"):
            os.environ["ISAN_PIN_THREADS"] = pin
            t0 = time.perf_counter(); eng.score(ids, normalize="none", threads=16, path=p); t[pin].append(time.perf_counter() - t0)
    for pin in t:
        cps = len(ids) / min(t[pin]); res[f"pin{pin} {p}"] = cps
        print(f"PIN={pin} threads=16 path={p} tile={s['variant']}: {cps/1e6:.3f}M chars/s ({cps*FL/1e9/pk[16]:.0%} of peak)", flush=True)
out["ab"] = res
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "xeon_tiles.json"), "w"), indent=1, default=str)
