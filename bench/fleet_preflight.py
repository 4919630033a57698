"""Time ansible/preflight.yml (ktdeploy doctor through ansible) over 1, 4 and 16 sshd container hosts.

    .venv/bin/python bench/fleet_preflight.py [--sizes 1,4,16] [--cpus 0.1] [--out bench/results/fleet-preflight.json]

--cpus gives every host container the same CPU quota at every fleet size (docker run --cpus), small enough
that 16 hosts never oversubscribe this machine: each host then brings "its own CPU", like a real fleet, and
only the controller is shared, so N-host time / 1-host time measures ansible's and ktdeploy's controller-side
cost. The controller's CPU seconds (ansible-playbook and its workers: RUSAGE_CHILDREN) are reported per host.

For each size N: start N fresh test hosts (tests/integration/hosts.py), run preflight.yml twice:
cold (ktdeploy shipped + installed into a venv on every host, then doctor) and warm (venv in place: doctor
only, changed=0). The wheelhouse is built once before timing (its build time is reported apart). Prints the
times side by side and the ratios N-host time / 1-host time; the hosts share this machine's cores, so the
ratio shows how far ansible's forks overlap the per-host work on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.hosts import HostPool, docker_available  # noqa: E402

ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent
WAIVE = ["gpu.present", "docker.nvidia_runtime"]


def inventory(path: Path, pool: HostPool, hosts) -> None:
    common = f"-o UserKnownHostsFile={pool.known_hosts} -o StrictHostKeyChecking=yes -o ConnectTimeout=10"
    inv = {"all": {"children": {"ktdeploy_fleet": {
        "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(pool.key),
                 "ansible_ssh_common_args": common, "ansible_python_interpreter": "/usr/bin/python3",
                 "ktdeploy_waive_checks": WAIVE},
        "hosts": {h.name: {"ansible_host": h.address, "ansible_port": h.port} for h in hosts}}}}}
    path.write_text(json.dumps(inv))


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def play(inv: Path, playbook: str, *extra: str) -> tuple[float, str, int, float]:
    """(wall s, output, rc, controller CPU s of ansible-playbook and every process it waited for)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    c0, t0 = _child_cpu(), time.perf_counter()
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), playbook, *extra], cwd=ANSIBLE, env=env,
                       capture_output=True, text=True, timeout=1800)
    return time.perf_counter() - t0, p.stdout + p.stderr, p.returncode, _child_cpu() - c0


def recap(out: str) -> dict[str, dict[str, int]]:
    res = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", out.split("PLAY RECAP", 1)[-1], re.M):
        res[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--docker-socket", action="store_true",
                    help="Mount this machine's docker socket into every host (then doctor's docker probes of all hosts "
                         "share one engine: a shared resource besides the controller). Default: off, docker.present "
                         "is skipped on hosts without a daemon")
    ap.add_argument("--seed", action="store_true",
                    help="Install once (cold run on one unlimited host), docker commit it, and start every fleet from "
                         "that image: each size is then timed warm only (the routine preflight), all hosts under quota")
    ap.add_argument("--quota-from", choices=["cold", "warm"], default="cold",
                    help="warm: start the hosts unlimited, install (cold run), then `docker update --cpus` every host "
                         "before the warm run (the cold run is then not quota-measured)")
    ap.add_argument("--cpus", default="0.1", help="CPU quota of every host container (docker run --cpus); "
                                                  "'none' = unlimited (hosts share this machine's cores)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="Measure the sizes this many times, interleaved (1,4,16,1,4,16,...); the ratios use each "
                         "size's median warm time")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fleet-preflight.json"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")] * max(1, args.repeat)
    if not docker_available():
        print("no docker engine reachable", file=sys.stderr)
        return 2
    # Build the wheelhouse once (controller side), so every timed run ships the same bytes.
    with tempfile.TemporaryDirectory() as d:
        empty = Path(d) / "inv.json"
        empty.write_text(json.dumps({"all": {"hosts": {}}}))
        t0 = time.perf_counter()
        wh = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "/dev/stdin",
                             "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"preflight_source={REPO}",
                             "-e", f"preflight_wheelhouse={ANSIBLE / '.wheelhouse'}"], cwd=ANSIBLE,
                            input=json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
                                {"ansible.builtin.include_role": {"name": "preflight", "tasks_from": "wheelhouse"}}]}]),
                            env=dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg")),
                            capture_output=True, text=True)
        build_s = time.perf_counter() - t0
        if wh.returncode != 0:
            print(wh.stdout[-3000:], wh.stderr[-2000:], file=sys.stderr)
            return 1
    rows = []
    seed_image = None
    if args.seed:
        with tempfile.TemporaryDirectory() as d:
            pool = HostPool(Path(d) / "pool")
            try:
                h = pool.start("seed", extra=["--shm-size", "1g", "--cap-add", "SYS_NICE"],
                               docker_socket=args.docker_socket)
                inv = Path(d) / "inv.json"
                inventory(inv, pool, [h])
                secs, out, rc, cpu = play(inv, "preflight.yml", "-e", "preflight_wheelhouse_build=false")
                if rc != 0:
                    print(out[-4000:], file=sys.stderr)
                    raise SystemExit("seed install failed")
                seed_image = f"ktd-bench-seed:{pool.tag}"
                subprocess.run(["docker", "commit", h.container, seed_image], check=True, capture_output=True)
                print(f"seed host installed in {secs:.1f} s, committed as {seed_image}", flush=True)
            finally:
                pool.close()
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            pool = HostPool(Path(d) / "pool")
            try:
                t0 = time.perf_counter()
                quota = [] if args.cpus == "none" or args.quota_from == "warm" else ["--cpus", args.cpus]
                if seed_image:
                    quota = [] if args.cpus == "none" else ["--cpus", args.cpus]
                hosts = [pool.start(f"bench{i:02d}", extra=["--shm-size", "1g", "--cap-add", "SYS_NICE", *quota],
                                    docker_socket=args.docker_socket, image=seed_image)
                         for i in range(n)]
                start_s = time.perf_counter() - t0
                inv = Path(d) / "inv.json"
                inventory(inv, pool, hosts)
                res = {"hosts": n, "start_hosts_s": round(start_s, 1), "loadavg_1m_before": round(os.getloadavg()[0], 2)}
                for phase in (("warm",) if seed_image else ("cold", "warm")):
                    if phase == "warm" and args.quota_from == "warm" and args.cpus != "none" and not seed_image:
                        for h in hosts:
                            subprocess.run(["docker", "update", "--cpus", args.cpus, h.container], check=True,
                                           capture_output=True)
                    secs, out, rc, cpu = play(inv, "preflight.yml", "-e", "preflight_wheelhouse_build=false")
                    rec = recap(out)
                    bad = {h: r for h, r in rec.items() if h != "localhost" and (r["failed"] or r["unreachable"])}
                    if rc != 0 or bad or len(rec) - 1 != n:
                        print(out[-4000:], file=sys.stderr)
                        raise SystemExit(f"{phase} preflight over {n} hosts failed: {bad or rc}")
                    res[f"{phase}_s"] = round(secs, 1)
                    res[f"{phase}_controller_cpu_s"] = round(cpu, 1)
                    res[f"{phase}_controller_cpu_s_per_host"] = round(cpu / n, 2)
                    res[f"{phase}_tasks_per_host"] = rec.get(hosts[0].name, {}).get("ok", 0) + \
                        rec.get(hosts[0].name, {}).get("skipped", 0)
                    res[f"{phase}_changed"] = sum(r["changed"] for h, r in rec.items() if h != "localhost")
                res["loadavg_1m_after"] = round(os.getloadavg()[0], 2)  # other work on this machine shows here
                rows.append(res)
                print(f"{n:>3} hosts: cold {res.get('cold_s', 0):7.1f} s   warm {res['warm_s']:7.1f} s   ctl cpu/host {res['warm_controller_cpu_s_per_host']:.2f} "
                      f"(changed on warm run: {res['warm_changed']})", flush=True)
            finally:
                pool.close()
    if seed_image:
        subprocess.run(["docker", "rmi", seed_image], capture_output=True)
        for r in rows:
            for k in ("s", "changed", "controller_cpu_s", "controller_cpu_s_per_host", "tasks_per_host"):
                r[f"cold_{k}"] = r.get(f"cold_{k}", 0) or 0
    base = rows[0]
    for r in rows:
        r["cold_ratio_vs_1"] = round(r["cold_s"] / base["cold_s"], 2) if base["cold_s"] else None
        r["warm_ratio_vs_1"] = round(r["warm_s"] / base["warm_s"], 2)
    # several measurements per size (--repeat): the ratios below use each size's median warm time
    medians = {n: statistics.median(r["warm_s"] for r in rows if r["hosts"] == n) for n in dict.fromkeys(sizes)}
    cpu_medians = {n: round(statistics.median(r["warm_controller_cpu_s_per_host"] for r in rows if r["hosts"] == n), 2)
                   for n in dict.fromkeys(sizes)}
    print()
    print(f"{'hosts':>5}  {'cold s':>7}  {'warm s':>7}  {'cold/1':>6}  {'warm/1':>6}  {'ctl cpu/host cold':>17}  {'warm':>5}")
    for r in rows:
        print(f"{r['hosts']:>5}  {r['cold_s']:>7.1f}  {r['warm_s']:>7.1f}  {r['cold_ratio_vs_1'] or 0:>6.2f}  "
              f"{r['warm_ratio_vs_1']:>6.2f}  {r['cold_controller_cpu_s_per_host']:>17.2f}  "
              f"{r['warm_controller_cpu_s_per_host']:>5.2f}")
    last = rows[-1]
    print(f"\n{last['hosts']}-host time / {base['hosts']}-host time: cold {last['cold_ratio_vs_1'] or 0:.2f}, "
          f"warm {last['warm_ratio_vs_1']:.2f}")
    by = {r["hosts"]: r for r in rows}
    ratios: dict = {}
    for n, key in ((16, "sixteen"), (4, "four")):
        if n in medians and 1 in medians:
            ratios[f"{key}_over_one_quota"] = round(medians[n] / medians[1], 2)
            if by[n]["cold_ratio_vs_1"] is not None and args.repeat == 1:
                ratios[f"{key}_over_one_quota_cold"] = by[n]["cold_ratio_vs_1"]
    ratios["warm_s_median"] = {str(n): round(v, 1) for n, v in medians.items()}
    ratios["controller_cpu_s_per_host_median"] = {str(n): v for n, v in cpu_medians.items()}
    print("ratios:", ratios)
    result = {"benchmark": "fleet preflight (ansible/preflight.yml: ktdeploy doctor on every host)",
              "command": f"python bench/fleet_preflight.py --sizes {args.sizes} --cpus {args.cpus}"
                         + (f" --repeat {args.repeat}" if args.repeat > 1 else "")
                         + (" --docker-socket" if args.docker_socket else "") + f" --quota-from {args.quota_from}"
                         + (" --seed" if args.seed else ""),
              "host_cpu_quota": args.cpus, "quota_from": args.quota_from,
              **ratios,
              "ratio_note": "*_over_one_quota = warm run (venv in place: the routine preflight); *_cold = first run "
                            "(wheelhouse shipped + pip install --require-hashes, then doctor)",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "ansible_forks": 32, "hosts": "sshd containers (ktdeploy/testhost) on one docker network"},
              "wheelhouse_build_s": round(build_s, 1), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
