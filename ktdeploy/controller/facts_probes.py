"""Execution probes: tiny C programs that prove what flags only claim (AMX tiles, AVX512, set_mempolicy).

Where a probe binary comes from, in order:
1. prebuilt at image build time: $KTDEPLOY_PROBE_DIR/<name> or /opt/ktdeploy/probes/<name> on the target;
2. cached on the target: ~/.cache/ktdeploy/probes/<source-hash>/<name> (or $TMPDIR, else /tmp, /ktdeploy-probes-<uid>/...);
3. compiled on the target with its cc/gcc from the source shipped in this package;
4. compiled here as a static x86_64 binary and uploaded (targets without a compiler).
If none works the probe is reported as skipped with the reason — never guessed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources

from ktdeploy.core.facts.host import AmxProbe, MempolicyProbe, Probes

PROBES = ("amx_probe", "numa_probe")

# Fixed script: $1 = probe name, $2 = source hash. Runs a prebuilt or cached probe (exit 200: none found).
_RUN_SCRIPT = r"""
name=$1; hash=$2
for d in "$KTDEPLOY_PROBE_DIR" /opt/ktdeploy/probes; do
  if [ -n "$d" ] && [ -x "$d/$name" ]; then exec "$d/$name"; fi
done
for c in "${XDG_CACHE_HOME:-$HOME/.cache}/ktdeploy/probes" "${TMPDIR:-/tmp}/ktdeploy-probes-$(id -u)"; do
  if [ -x "$c/$hash/$name" ]; then exec "$c/$hash/$name"; fi
done
exit 200
"""

# Fixed script: $1 = hash. Prints a writable cache dir for this hash and the compiler found (if any).
_PREPARE_SCRIPT = r"""
hash=$1
for c in "${XDG_CACHE_HOME:-$HOME/.cache}/ktdeploy/probes" "${TMPDIR:-/tmp}/ktdeploy-probes-$(id -u)"; do
  if mkdir -p "$c/$hash" 2>/dev/null && [ -w "$c/$hash" ]; then echo "dir=$c/$hash"; break; fi
done
for cc in cc gcc clang; do
  if command -v "$cc" >/dev/null 2>&1; then echo "cc=$(command -v "$cc")"; break; fi
done
"""


def probe_source(name: str) -> bytes:
    return resources.files("ktdeploy.probes").joinpath(f"{name}.c").read_bytes()


def source_hash(name: str) -> str:
    return hashlib.sha256(probe_source(name)).hexdigest()[:16]


def build_probe(name: str, out_dir: str, *, cc: str | None = None, static: bool = False) -> str:
    """Compile a probe here (image build time, or for upload). Returns the binary path; raises on failure."""
    cc = cc or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise FileNotFoundError("no C compiler (cc/gcc/clang) found")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, f"{name}.c")
        with open(src, "wb") as f:
            f.write(probe_source(name))
        out = os.path.join(out_dir, name)
        cmd = [cc, "-O1", "-o", out, src] + (["-static"] if static else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{cc} failed: {p.stderr.strip()[-400:]}")
    return out


def parse_probe_output(text: str) -> dict:
    """The last JSON line a probe printed."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("probe printed no JSON line")


def amx_from_output(text: str) -> AmxProbe:
    data = parse_probe_output(text)
    return AmxProbe(ran=True, **{k: v for k, v in data.items() if k in AmxProbe.model_fields})


def mempolicy_from_output(text: str) -> MempolicyProbe:
    data = parse_probe_output(text)
    return MempolicyProbe(ran=True, **{k: v for k, v in data.items() if k in MempolicyProbe.model_fields})


def run_probe(connector, name: str, *, machine: str | None = None) -> tuple[str | None, str | None]:
    """Run probe ``name`` on the connector's host. Returns (stdout, None) or (None, why it was skipped)."""
    if machine and machine not in ("x86_64", "amd64"):
        return None, f"probes are x86_64 only (target is {machine})"
    h = source_hash(name)
    res = connector.run(["sh", "-c", _RUN_SCRIPT, "ktdeploy-probe", name, h], timeout=60)
    if res.rc != 200:
        return _result(res, name)
    prep = connector.run(["sh", "-c", _PREPARE_SCRIPT, "ktdeploy-probe", h], timeout=30)
    kv = dict(line.split("=", 1) for line in prep.stdout.splitlines() if "=" in line)
    target_dir = kv.get("dir")
    if not target_dir:
        return None, "no writable cache directory on the target (~/.cache or /tmp)"
    with tempfile.TemporaryDirectory() as tmp:
        if kv.get("cc"):
            src = os.path.join(tmp, f"{name}.c")
            with open(src, "wb") as f:
                f.write(probe_source(name))
            connector.put_file(src, f"{target_dir}/{name}.c")
            cc = connector.run([kv["cc"], "-O1", "-o", f"{target_dir}/{name}", f"{target_dir}/{name}.c"], timeout=120)
            if cc.rc != 0:
                return None, f"compiling {name}.c on the target failed: {(cc.stderr or cc.stdout).strip()[-300:]}"
        else:
            try:
                binary = build_probe(name, tmp, static=True)
            except (FileNotFoundError, RuntimeError) as e:
                return None, f"no C compiler on the target and a static build here failed ({e})"
            connector.put_file(binary, f"{target_dir}/{name}", mode=0o755)
    res = connector.run(["sh", "-c", _RUN_SCRIPT, "ktdeploy-probe", name, h], timeout=60)
    if res.rc == 200:
        return None, "the probe binary did not appear in the cache directory"
    return _result(res, name)


def _result(res, name: str) -> tuple[str | None, str | None]:
    if res.rc != 0:
        return None, f"{name} exited {res.rc}: {(res.stderr or res.stdout).strip()[-300:]}"
    return res.stdout, None


# probe program -> the Probes field it fills, its output parser, and its model (for "skipped"). Its own name: it
# once rebound PROBES (the names), so `python -m ktdeploy.controller.facts_probes build DIR` got tuples, not names.
PROBE_PARSERS = (("amx_probe", "amx", amx_from_output, AmxProbe),
          ("numa_probe", "mempolicy", mempolicy_from_output, MempolicyProbe))


def gather_probes(connector, machine: str | None) -> tuple[Probes, dict[str, str]]:
    """Run every probe; returns the parsed Probes and the raw outputs (for recording golden files)."""
    raw: dict[str, str] = {}
    probes = Probes()
    for name, field, parse, model in PROBE_PARSERS:
        out, why = run_probe(connector, name, machine=machine)
        if out is None:
            setattr(probes, field, model(skipped=why))
            continue
        raw[name] = out
        try:
            setattr(probes, field, parse(out))
        except (ValueError, RecursionError) as e:
            setattr(probes, field, model(skipped=f"unreadable probe output: {e}"))
    return probes, raw


def main(argv: list[str] | None = None) -> int:
    """`python -m ktdeploy.controller.facts_probes build DIR`: compile the probes into DIR (used at image build time)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "build":
        sys.stderr.write("usage: python -m ktdeploy.controller.facts_probes build DIR\n")
        return 2
    for name in PROBES:
        print(build_probe(name, args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
