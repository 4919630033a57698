"""Execution probes: tiny C programs that prove what flags only claim (AMX tiles, AVX512, set_mempolicy).

Where a probe binary comes from, in order:
1. prebuilt at image build time: $KTDEPLOY_PROBE_DIR/<name> or /opt/ktdeploy/probes/<name> on the target;
2. cached on the target in the user's own cache: ${XDG_CACHE_HOME:-~/.cache}/ktdeploy/probes/<source-hash>/<name>,
   next to <name>.sha256 written when it was made;
3. compiled on the target with its cc/gcc from the source shipped in this package (into that cache, or — when
   the cache cannot be used, e.g. an unwritable HOME — into a fresh private ``mktemp -d`` folder removed after
   the run: never a predictable shared path such as /tmp/ktdeploy-probes-<uid>);
4. compiled here as a static x86_64 binary and uploaded (targets without a compiler), to the same places.
If none works the probe is reported as skipped with the reason — never guessed.
The probes themselves (name, parser, model, timeout) are core/facts/sources.py's PROBE_SOURCES; their JSON line is
read by core/facts/probes.py.

Nothing is executed from a place another user can write (issue 35: a probe planted in the old /tmp fallback ran
as whoever ran doctor, root included, and its forged JSON was taken as proof of AMX). Before a binary runs, the
one runner (``_RUN_SCRIPT``; SSH hosts, docker hosts, ansible preflight and up's PREFLIGHT all call it) resolves
its real path and checks it and every folder above it: not a link, owned by the user or root, not writable by
group or others (a folder above may be shared only with the sticky bit, as /tmp); a cached binary must also match
the sha256 written beside it when it was made.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from typing import Any

from ktdeploy.controller.connectors.base import Connector, Result
from ktdeploy.core.facts.assemble import probes_from
from ktdeploy.core.facts.host import Probes
from ktdeploy.core.facts.sources import PROBE_SOURCES, ProbeSource

PROBES = tuple(p.name for p in PROBE_SOURCES)   # the programs' names (ktdeploy/probes/<name>.c)

# Shell functions every probe script shares: ``chain PATH`` succeeds when PATH (resolved) and every folder above
# it are trusted: not a link, owned by this user or root, not group/other-writable (a folder may be, with the
# sticky bit: nobody else can replace what we own in /tmp). ``sealed BIN`` also needs BIN.sha256 to match.
_TRUST_SH = r"""
me=$(id -u)
ok() {
  [ -e "$1" ] && [ ! -L "$1" ] || return 1
  s=$(stat -c '%u %a' -- "$1" 2>/dev/null) || return 1
  u=${s%% *}; m=$((0${s##* }))
  [ "$u" = "$me" ] || [ "$u" = 0 ] || return 1
  [ $((m & 022)) -eq 0 ] && return 0
  [ -d "$1" ] && [ $((m & 01000)) -ne 0 ]
}
chain() {
  p=$(readlink -f -- "$1" 2>/dev/null) || return 1
  while :; do ok "$p" || return 1; [ "$p" = / ] && return 0; p=$(dirname -- "$p"); done
}
sealed() {
  chain "$1" && chain "$1.sha256" && [ -x "$1" ] || return 1
  [ "$(sha256sum < "$1" 2>/dev/null | cut -d' ' -f1)" = "$(cat -- "$1.sha256" 2>/dev/null)" ]
}
cache_root() { [ -n "${XDG_CACHE_HOME:-$HOME}" ] && printf '%s' "${XDG_CACHE_HOME:-$HOME/.cache}/ktdeploy/probes"; }
"""

# $1 = probe name, $2 = source hash, $3 = a private folder of this run (optional). Runs a trusted prebuilt probe,
# or a sealed one from the user's cache or that folder (exit 200: none found).
_RUN_SCRIPT = _TRUST_SH + r"""
name=$1; hash=$2; own=$3
for d in "$KTDEPLOY_PROBE_DIR" /opt/ktdeploy/probes; do
  if [ -n "$d" ] && [ -e "$d/$name" ] && chain "$d/$name" && [ -x "$d/$name" ]; then
    exec "$(readlink -f -- "$d/$name")"
  fi
done
for c in "$own" "$(cache_root)/$hash"; do
  if [ -n "$c" ] && [ "$c" != "/$hash" ] && [ -e "$c/$name" ] && sealed "$c/$name"; then
    exec "$(readlink -f -- "$c/$name")"
  fi
done
exit 200
"""

# $1 = hash. Prints the folder to build the probe in — the user's cache (cache=1) when it and everything above it
# is trusted, else a fresh private mktemp -d folder (cache=0, removed after the run) — and the compiler found.
_PREPARE_SCRIPT = _TRUST_SH + r"""
hash=$1
c=$(cache_root)
a=$c; while [ -n "$a" ] && [ ! -e "$a" ]; do a=$(dirname -- "$a"); done   # made only under a trusted folder
if [ -n "$c" ] && chain "$a" && (umask 077; mkdir -p -- "$c/$hash") 2>/dev/null \
   && r=$(readlink -f -- "$c/$hash") && chain "$r" && [ -w "$r" ]; then
  echo "dir=$r"; echo "cache=1"
elif t=$(mktemp -d 2>/dev/null) && chain "$t"; then
  echo "dir=$t"; echo "cache=0"
fi
for cc in cc gcc clang; do
  if command -v "$cc" >/dev/null 2>&1; then echo "cc=$(command -v "$cc")"; break; fi
done
"""

# $1 = the binary just made in the folder _PREPARE_SCRIPT gave: record its sha256 beside it (what _RUN_SCRIPT checks).
_SEAL_SCRIPT = r"""
b=$1
[ -f "$b" ] && [ ! -L "$b" ] || exit 1
chmod 0755 -- "$b" || exit 1
rm -f -- "$b.sha256"
(umask 022; sha256sum < "$b" | cut -d' ' -f1 > "$b.sha256")
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
        with open(src, "wb") as f:  # a folder this process just created (TemporaryDirectory, mode 0700)
            f.write(probe_source(name))
        out = os.path.join(out_dir, name)
        cmd = [cc, "-O1", "-o", out, src] + (["-static"] if static else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{cc} failed: {p.stderr.strip()[-400:]}")
    return out


def run_probe(connector: Connector, probe: ProbeSource[Any], *,
              machine: str | None = None) -> tuple[str | None, str | None]:
    """Run ``probe`` on the connector's host. Returns (stdout, None) or (None, why it was skipped)."""
    if machine and machine not in ("x86_64", "amd64"):
        return None, f"probes are x86_64 only (target is {machine})"
    name = probe.name
    h = source_hash(name)
    res = connector.run(["sh", "-c", _RUN_SCRIPT, "ktdeploy-probe", name, h], timeout=probe.timeout_s)
    if res.rc != 200:
        return _result(res, name)
    prep = connector.run(["sh", "-c", _PREPARE_SCRIPT, "ktdeploy-probe", h], timeout=30)
    kv = dict(line.split("=", 1) for line in prep.stdout.splitlines() if "=" in line)
    target_dir = kv.get("dir")
    if not target_dir:
        return None, "no private folder for the probe on the target (the user's cache is not usable and mktemp -d failed)"
    private = kv.get("cache") != "1"
    try:
        why = _make_probe(connector, name, target_dir, kv.get("cc"))
        if why:
            return None, why
        res = connector.run(["sh", "-c", _RUN_SCRIPT, "ktdeploy-probe", name, h, target_dir if private else ""],
                            timeout=probe.timeout_s)
        if res.rc == 200:
            return None, "the probe binary did not appear (or is not owned by the user and sealed) in its folder"
        return _result(res, name)
    finally:
        if private:  # the one-run folder goes; the next doctor builds again
            connector.run(["rm", "-rf", "--", target_dir], timeout=30)


def _make_probe(connector: Connector, name: str, target_dir: str, cc: str | None) -> str | None:
    """Compile (or upload) probe ``name`` into ``target_dir`` and seal it; the reason it could not, or None."""
    binary_path = f"{target_dir}/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        if cc:
            src = os.path.join(tmp, f"{name}.c")
            with open(src, "wb") as f:  # a folder this process just created (TemporaryDirectory, mode 0700)
                f.write(probe_source(name))
            connector.put_file(src, f"{target_dir}/{name}.c")
            done = connector.run([cc, "-O1", "-o", binary_path, f"{target_dir}/{name}.c"], timeout=120)
            if done.rc != 0:
                return f"compiling {name}.c on the target failed: {(done.stderr or done.stdout).strip()[-300:]}"
        else:
            try:
                binary = build_probe(name, tmp, static=True)
            except (FileNotFoundError, RuntimeError) as e:
                return f"no C compiler on the target and a static build here failed ({e})"
            connector.put_file(binary, binary_path, mode=0o755)
    sealed = connector.run(["sh", "-c", _SEAL_SCRIPT, "ktdeploy-probe", binary_path], timeout=30)
    if sealed.rc != 0:
        return f"could not record the sha256 of {binary_path}: {(sealed.stderr or sealed.stdout).strip()[-300:]}"
    return None


def _result(res: Result, name: str) -> tuple[str | None, str | None]:
    if res.rc != 0:
        return None, f"{name} exited {res.rc}: {(res.stderr or res.stdout).strip()[-300:]}"
    return res.stdout, None


def gather_probes(connector: Connector, machine: str | None) -> tuple[Probes, dict[str, str]]:
    """Run every probe; returns the parsed Probes and the raw outputs (for recording golden files)."""
    raw: dict[str, str] = {}
    skips: dict[str, str] = {}
    for probe in PROBE_SOURCES:
        out, why = run_probe(connector, probe, machine=machine)
        if out is None:
            skips[probe.name] = why or ""
        else:
            raw[probe.name] = out
    return probes_from(raw, skips), raw


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
