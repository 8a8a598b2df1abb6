"""The cold library matrix (issue 53): ``castlab study --chains swiglu,rope --libraries all
--device cuda`` with an empty kernel cache, compiled serially (CASTLAB_COMPILE_THREADS=1)
and in parallel (the default thread count, or --threads), then warm (again, with the
disk cache the parallel run filled). Each run is a fresh process with its own
CASTLAB_CACHE_DIR. Prints wall seconds, the study's own elapsed_s, the kernel cache
counters of the parallel run and the ratio to the 20 s goal; ``--json PATH`` writes them.

Usage: python benchmarks/bench_cold_compile.py [--json PATH] [--threads N] [--no-serial]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

GOAL_S = 20.0
PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")


def run_matrix(cache: str, out: str, threads: int | None, extra: list) -> dict:
    """One `castlab study` process: wall seconds and its summary's elapsed_s."""
    env = dict(os.environ, CASTLAB_CACHE_DIR=cache)
    env.pop("CASTLAB_COMPILE_THREADS", None)
    if threads is not None:
        env["CASTLAB_COMPILE_THREADS"] = str(threads)
    env["PYTHONPATH"] = PKG + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "castlab", "study", "--chains", "swiglu,rope", "--device",
           "cuda", "--out", out, "--overwrite", "--no-plots", "--no-progress", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    with open(os.path.join(out, "summary.json")) as f:
        summ = json.load(f)
    elapsed = summ.get("elapsed_s")
    with open(os.path.join(out, "results.csv")) as f:
        csv = f.read()
    return {"wall_s": round(wall, 3), "elapsed_s": elapsed, "threads": threads,
            "kernel_files": len([p for p in os.listdir(cache) if p.endswith(".bin")]),
            "timing": summ.get("timing"), "csv": csv}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    ap.add_argument("--threads", type=int, default=None,
                    help="compile threads of the parallel run (default: castlab's default)")
    ap.add_argument("--no-serial", action="store_true", help="skip the serial cold run")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm run")
    ap.add_argument("--math-all", action="store_true",
                    help="the `--math all` form instead of `--libraries all`")
    a = ap.parse_args()
    extra = ["--math", "all"] if a.math_all else ["--libraries", "all"]
    sys.path.insert(0, PKG)
    import castlab.cuda as clcuda

    res: dict = {"goal_s": GOAL_S, "cpus": len(os.sched_getaffinity(0)),
                 "default_threads": clcuda.compile_threads(), "form": " ".join(extra)}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [] if a.no_serial else [("cold_serial", 1, "serial")]
        runs += [("cold_parallel", a.threads, "parallel")]
        runs += [] if a.no_warm else [("warm", a.threads, "parallel")]
        for key, threads, cache in runs:
            res[key] = run_matrix(os.path.join(tmp, cache), os.path.join(tmp, f"out_{key}"),
                                  threads, extra)
            print(f"{key:14s} {res[key]['wall_s']:8.2f} s wall  (study {res[key]['elapsed_s']} "
                  f"s, {res[key]['kernel_files']} kernel files)", flush=True)
            tm = res[key]["timing"] or {}
            if tm:
                w, e = tm["kernel_cache_after_warm"], tm["kernel_cache_end"]
                print(f"{'':14s} warm-up {tm['warm_s']} s: {w['compiles']} compiles "
                      f"({w['compile_seconds']:.1f} s summed over threads); after it "
                      f"{e['compiles'] - w['compiles']} more compiles "
                      f"({e['compile_seconds'] - w['compile_seconds']:.1f} s)", flush=True)
                prof = tm.get("warm_compiles") or {}
                if prof.get("runs"):
                    print(f"{'':14s} NVRTC runs of the warm-up: {prof['runs']} over "
                          f"{prof['wall_s']} s, {prof['overlap']} at a time on average; "
                          "longest: " + ", ".join(f"{r['name']} {r['seconds']} s "
                                                  f"({r['source_chars']} chars)"
                                                  for r in prof["longest"][:5]), flush=True)
    csvs = {k: res[k].pop("csv") for k in ("cold_serial", "cold_parallel", "warm") if k in res}
    res["identical"] = len(set(csvs.values())) == 1
    cold = res["cold_parallel"]["wall_s"]
    res["cold_parallel_vs_goal"] = round(cold / GOAL_S, 3)
    if "cold_serial" in res:
        res["speedup"] = round(res["cold_serial"]["wall_s"] / cold, 2)
        print(f"speedup {res['speedup']}x")
    print(f"cold parallel {cold:.2f} s = {res['cold_parallel_vs_goal']:.2f} x the {GOAL_S:.0f} s "
          f"goal ({'met' if cold <= GOAL_S else 'NOT met'}); results identical: "
          f"{res['identical']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
