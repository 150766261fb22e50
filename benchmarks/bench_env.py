"""hpcml env: resolving + rendering an EDF, and what ``hpcml env run`` adds over calling
the runtime directly, side by side in one run.

    python benchmarks/bench_env.py --runs 30

- Resolve + render, in process: an EDF inheriting from two base files (mounts, env with
  expansions, annotations), ``hpcml.env.resolve`` then the bubblewrap and podman
  renderers; median over --runs x 20 calls. Also ``hpcml env render`` as a whole command.
- Run overhead: ``/bin/true`` in the suite's busybox root filesystem through
  ``bwrap ...`` exactly as hpcml renders it, against ``hpcml env run --runtime bubblewrap``
  (the console script of this interpreter, so no pyenv shim), alternated run after run;
  the same for podman when it runs here. ``python -c pass`` is the interpreter's floor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.env import rootfs  # noqa: E402  (the tests' busybox image builder)

IMAGE_REF = "localhost/hpcml-bench:1"


def write_edfs(tmp: Path, image: str) -> tuple[Path, dict[str, str]]:
    (tmp / "edfs").mkdir()
    (tmp / "data").mkdir()
    (tmp / "edfs" / "base.toml").write_text(f'''
image = "{image}"
workdir = "/tmp"
mounts = ["{tmp}/data:/data:ro"]
[env]
A = "1"
B = "${{HOME}}/b"
[annotations]
com.example.x = "1"
''')
    (tmp / "edfs" / "middle.toml").write_text('base_environment = "base"\nworkdir = "/work"\n'
                                              '[env]\nC = "${NOPE:-default}"\n')
    edf = tmp / "env.toml"
    edf.write_text('base_environment = ["middle"]\nwritable = false\n[env]\nD = "$$x"\nE = ""\n')
    return edf, dict(os.environ, EDF_PATH=str(tmp / "edfs"))


def median_ms(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def alternate(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in commands}
    for argv in commands.values():                   # warm-up
        median_ms(argv, 1, env)
    for _ in range(runs):
        for name, argv in commands.items():
            times[name] += median_ms(argv, 1, env)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "env.json")
    args = ap.parse_args()
    from hpcml.env.resolve import resolve
    from hpcml.env.run import render

    tmp = Path(tempfile.mkdtemp(prefix="hpcml-bench-env-"))
    hpcml = str(Path(sys.executable).with_name("hpcml"))
    result: dict = {"date": time.strftime("%Y-%m-%d"), "runs": args.runs}
    try:
        root = rootfs.build_rootfs(tmp / "rootfs")
        edf, environ = write_edfs(tmp, str(root))
        os.environ.update(environ)

        per_call = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            for _ in range(20):
                env, _w = resolve(edf)
                render(env, ["/bin/true"], "bubblewrap")
                render(env, ["/bin/true"], "podman")
            per_call.append((time.perf_counter() - t0) / 20 * 1e3)
        result["resolve_render_ms"] = round(statistics.median(per_call), 3)
        print(f"resolve + render (bubblewrap and podman), in process: {result['resolve_render_ms']:.2f} ms "
              "(goal < 50 ms)")

        env, _w = resolve(edf)
        direct = render(env, ["/bin/true"], "bubblewrap").argv
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "bwrap directly": direct,
            "hpcml env run (bubblewrap)": [hpcml, "env", "run", "--runtime", "bubblewrap", str(edf), "--", "/bin/true"],
            "hpcml env render (whole command)": [hpcml, "env", "render", "--runtime", "bubblewrap", str(edf), "--",
                                                 "/bin/true"],
        }
        podman_env = dict(environ)
        if shutil.which("podman"):
            podman_env["CONTAINERS_CONF"] = str(rootfs.podman_conf(tmp / "containers.conf"))
            rootfs.podman_import(root, IMAGE_REF, podman_env)
            (tmp / "podman.toml").write_text(f'image = "{IMAGE_REF}"\nworkdir = "/work"\n[env]\nA = "1"\n')
            penv, _w = resolve(tmp / "podman.toml")
            commands["podman run directly"] = render(penv, ["/bin/true"], "podman").argv
            commands["hpcml env run (podman)"] = [hpcml, "env", "run", "--runtime", "podman",
                                                  str(tmp / "podman.toml"), "--", "/bin/true"]
        times = alternate(commands, args.runs, podman_env)
        med = {k: statistics.median(v) for k, v in times.items()}
        result["commands_ms"] = {k: {"median": round(med[k], 1), "min": round(min(times[k]), 1),
                                     "max": round(max(times[k]), 1)} for k in times}
        print(f"whole commands, {args.runs} alternated runs (ms):")
        for k in times:
            print(f"  {k:<34} median {med[k]:7.1f}  min {min(times[k]):7.1f}  max {max(times[k]):7.1f}")
        added = med["hpcml env run (bubblewrap)"] - med["bwrap directly"]
        result["run_added_ms_bubblewrap"] = round(added, 1)
        result["run_ratio_bubblewrap"] = round(med["hpcml env run (bubblewrap)"] / med["bwrap directly"], 2)
        print(f"hpcml env run adds {added:.1f} ms over bwrap (x{result['run_ratio_bubblewrap']}; goal < 100 ms)")
        if "podman run directly" in med:
            added = med["hpcml env run (podman)"] - med["podman run directly"]
            result["run_added_ms_podman"] = round(added, 1)
            result["run_ratio_podman"] = round(med["hpcml env run (podman)"] / med["podman run directly"], 2)
            print(f"hpcml env run adds {added:.1f} ms over podman run (x{result['run_ratio_podman']})")
    finally:
        if shutil.which("podman"):
            subprocess.run(["podman", "rmi", "-f", IMAGE_REF], capture_output=True,
                           env=dict(os.environ, CONTAINERS_CONF=str(tmp / "containers.conf")))
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
