"""Probe 4: a seeded generator of hostile recipe / CLI values for the files `render --slurm` and `render --k8s`
write, and independent oracles that judge each rendering the way its reader does.

Written from the renderers (ktdeploy/core/sched/batch.py, k8s.py, render.py), not from the earlier probe's tests.
Every value goes to one TARGET (a recipe key, the recipe file's name, or a CLI option); the recipe is written to a
file, loaded and checked as `ktdeploy check` does (``require_valid``); what check ACCEPTS is rendered and judged:

  sbatch   the #SBATCH header read the way sbatch reads it (Slurm src/sbatch/opt.c ``_opt_batch_script`` /
           ``get_argument``): lines split on "\\n" only; a line that starts with ``#SBATCH`` (or ``#SLURM``) is a
           directive line; any other line whose first non-blank is not ``#`` ends the header; a directive line that
           holds ``packjob`` or ``hetjob`` (any case) separates heterogeneous-job components (sbatch counts it and
           blanks the word); a directive line is split into arguments on unquoted blanks, ``'`` and ``"`` quote,
           ``\\`` escapes the next character inside quotes too, an unquoted ``#`` ends the line. The options must be
           exactly the ones ktdeploy meant, one component, and Slurm's filename pattern of --output must expand to
           the job folder (``%%`` -> ``%``, ``%j`` the job id; any other ``%`` or a ``\\`` changes the path).
  bash     ``bash -n`` on the script, then the script's own words run with a stub ``docker`` (and stub mkdir /
           id / hostname; the lines that write files removed) that records its argv: each docker call must get
           exactly ktdeploy's argv (core/plan/docker_argv.py) with the value as one item.
  k8s      every manifest dumped by ``render_yaml`` loads back with ``yaml.safe_load_all`` (PyYAML, YAML 1.1, what
           kubectl-side Python tools use) to the same objects, and the ConfigMap's recipe loads back to the recipe.

``run(n, seed)`` returns a Report (values generated, accepted by check, escapes by class with one example each).
"""

from __future__ import annotations

import base64
import copy
import os
import random
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
BASE_RECIPE = REPO / "recipes" / "tiny-moe-lora.yaml"
JOB_ID = "4242"

# Fragments a hostile value is made of: shell, sbatch, Slurm filename patterns, YAML, line breaks, bidi.
ATOMS = [
    " ", "  ", "'", '"', "#", "# x", "%", "%j", "%x", "%%", "%5j", "$(id)", "`id`", "${HOME}", "$HOME", ";", "&&", "|",
    ">", "<", "*", "?", "[a]", "\\", "\\n", "\n", "\r", "\r\n", "\x00", "\t", "\x0b", "\x0c", "\x1b[31m", "\x7f",
    "\u2028", "\u2029", "\x85", "\u202e", "\u2066", "\u200f", "\u061c", "\ufeff", "\u00a0", "\u3000", "\u2000",
    "é", "ß", "\U0001f600", "-", "--", "-x", "--wrap=id", "--uid=0", ": ", ":", "&a", "*a", "!!python/none", "!x",
    "{", "}", "[", "]", ",", "=", "~", "<<", "@", "`", "'\"'", "hetjob", "packjob", "HetJob", "PACKJOB", "yes", "no",
    "on", "null", "1:20", "0o17", "0x1F", "1_000", ".inf", "2001-12-14", "1e3", "#SBATCH --uid=0", "#!", "\\\\",
]
SAFE = "abcdefghijklmnopqrstuvwxyz0123456789"
HETJOB = "sbatch header: a directive line holding hetjob/packjob splits the job"
NEL = "recipe YAML (shipped / ConfigMap) loads back to another value"

# Where a value goes: (name, how it is put into the recipe document / file name / CLI)
Doc = dict[str, Any]


@dataclass
class Case:
    target: str
    value: str
    stem: str = "tiny"
    doc: Doc = field(default_factory=dict)
    variant: str = "avx2"
    namespace: str = "default"
    overrides: list[str] = field(default_factory=list)


def _base() -> Doc:
    doc = yaml.safe_load(BASE_RECIPE.read_text())
    doc["deploy"]["scheduler"] = {"mem_gib": 8, "cpus": 4}   # no planner / host needed
    doc["deploy"]["registry"] = "registry.example.com/ml"     # render --k8s refuses a local tag
    return doc


def _set(doc: Doc, dotted: str, value: Any) -> None:
    node = doc
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _vol(key: str, train_key: str, leaf: str) -> Callable[[Case], None]:
    """A volume holding the value, with the training path that must lie inside it moved along."""
    def put(c: Case) -> None:
        vol = f"/srv/{c.value}"
        _set(c.doc, f"deploy.volumes.{key}", vol)
        _set(c.doc, f"train.{train_key}", f"{vol}/{leaf}")
    return put


def _key(dotted: str, wrap: Callable[[str], Any] = lambda v: v) -> Callable[[Case], None]:
    def put(c: Case) -> None:
        _set(c.doc, dotted, wrap(c.value))
    return put


def _stem(c: Case) -> None:
    c.stem = c.value


def _variant(c: Case) -> None:
    c.variant = c.value


def _namespace(c: Case) -> None:
    c.namespace = c.value


def _set_option(dotted: str) -> Callable[[Case], None]:
    def put(c: Case) -> None:
        c.overrides.append(f"{dotted}={c.value}")
    return put


TARGETS: dict[str, Callable[[Case], None]] = {
    "--set train.run_name": _set_option("train.run_name"),
    "--set deploy.scheduler.partition": _set_option("deploy.scheduler.partition"),
    "accelerate.main_training_function": _key("accelerate.main_training_function"),
    "recipe file name": _stem,
    "deploy.volumes.output": _vol("output", "output_dir", "run"),
    "deploy.volumes.model": _vol("model", "model_name_or_path", "tiny-qwen3-moe"),
    "deploy.volumes.data": _vol("data", "dataset_dir", "d"),
    "train.output_dir": _key("train.output_dir", lambda v: f"/srv/ktdeploy/output/{v}"),
    "train.model_name_or_path": _key("train.model_name_or_path", lambda v: f"/srv/ktdeploy/models/{v}"),
    "train.run_name": _key("train.run_name"),
    "train.dataset": _key("train.dataset"),
    "deploy.image": _key("deploy.image"),
    "deploy.image_repo": _key("deploy.image_repo"),
    "deploy.registry": _key("deploy.registry"),
    "deploy.serve.host": _key("deploy.serve.host"),
    "deploy.serve.served_model_name": _key("deploy.serve.served_model_name"),
    "deploy.serve.lora_name": _key("deploy.serve.lora_name"),
    "deploy.serve.api_key_env": _key("deploy.serve.api_key_env"),
    "deploy.serve.extra_args": _key("deploy.serve.extra_args", lambda v: ["--chat-template", v]),
    "deploy.scheduler.partition": _key("deploy.scheduler.partition"),
    "deploy.scheduler.account": _key("deploy.scheduler.account"),
    "deploy.scheduler.time": _key("deploy.scheduler.time"),
    "render --variant": _variant,
    "render --namespace": _namespace,
}


def values(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (target, value) pairs, seeded: first every atom alone in every target, then random mixes."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for target in TARGETS:
        for atom in ATOMS:
            out.append((target, f"a{atom}b" if target not in ("render --variant", "render --namespace") else atom))
    rng.shuffle(out)
    out = out[:n // 2]   # half single atoms (every target), half mixes
    while len(out) < n:
        parts = [rng.choice(ATOMS) if rng.random() < 0.6 else "".join(rng.choices(SAFE, k=rng.randint(1, 6)))
                 for _ in range(rng.randint(1, 5))]
        v = "".join(parts)
        if rng.random() < 0.03:
            v = v + "x" * rng.choice((300, 5000))
        out.append((rng.choice(list(TARGETS)), v))
    return out


# -- the sbatch oracle ----------------------------------------------------------------------------------------
def sbatch_arguments(line: str) -> list[str]:
    """Slurm's get_argument, repeated over a directive line's text after the magic word."""
    args: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in " \t\n\v\f\r":
            i += 1
        if i >= n:
            return args
        if line[i] == ":":
            raise ValueError("sbatch: Unexpected `:`")
        arg, quoted, q, esc = [], False, "", False
        while i < n and (quoted or line[i] not in " \t\n\v\f\r") and line[i] != "\n":
            ch = line[i]
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
                i += 1
                continue
            elif quoted:
                if ch == q:
                    quoted = False
                    i += 1
                    continue
            elif ch in "\"'":
                quoted, q = True, ch
                i += 1
                continue
            elif ch == "#":
                i = n
                break
            arg.append(ch)
            i += 1
        if quoted:
            raise ValueError(f"sbatch: Unmatched `{q}`")
        if arg:
            args.append("".join(arg))


def sbatch_header(script: str) -> tuple[list[list[str]], list[str]]:
    """(the directive arguments of each heterogeneous component, problems) as sbatch reads ``script``."""
    comps: list[list[str]] = [[]]
    problems: list[str] = []
    for line in script.split("\n"):
        if line.startswith(("#SBATCH", "#SLURM")):
            body = line[7:] if line.startswith("#SBATCH") else line[6:]
            low = line.lower()
            if "packjob" in low or "hetjob" in low:
                problems.append(f"hetjob separator in directive line {line[:120]!r}")
                comps.append([])
                for word in ("packjob", "hetjob"):
                    k = body.lower().find(word)
                    if k >= 0:
                        body = body[:k] + " " * len(word) + body[k + len(word):]
            try:
                comps[-1] += sbatch_arguments(body)
            except ValueError as e:
                problems.append(f"{e} in {line[:120]!r}")
            continue
        stripped = line.lstrip(" \t\v\f\r")
        if stripped and not stripped.startswith("#"):
            break
    return comps, problems


def slurm_filename(pattern: str) -> str | None:
    """Slurm's filename pattern expanded for JOB_ID (None: a backslash switches patterns off)."""
    if "\\" in pattern:
        return None
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "%":
                out.append("%")
            elif nxt == "j":
                out.append(JOB_ID)
            else:
                out.append(f"<%{nxt}>")   # some other pattern: never the literal text
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def judge_sbatch(script: str, *, name: str, role: str, job_dir: str, partition: str | None,
                 account: str | None) -> list[str]:
    comps, problems = sbatch_header(script)
    if len(comps) != 1:
        problems.append(f"{len(comps)} heterogeneous components, ktdeploy meant one")
    args = comps[0] if comps else []
    meant = {"--job-name": name if role == "train" else f"{name}-{role}",
             "--output": None, "--open-mode": "append"}
    if partition:
        meant["--partition"] = partition
    if account:
        meant["--account"] = account
    seen: dict[str, str | None] = {}
    for a in args:
        if not a.startswith("--"):
            problems.append(f"argument {a[:80]!r} is no long option")
            continue
        opt, eq, val = a.partition("=")
        if opt in seen:
            problems.append(f"{opt} twice")
        seen[opt] = val if eq else None
    allowed = {"--job-name", "--output", "--open-mode", "--time", "--mem", "--cpus-per-task", "--hint", "--gres",
               "--constraint", "--requeue", "--signal", "--no-requeue", "--partition", "--account"}
    for opt in seen:
        if opt not in allowed:
            problems.append(f"unexpected option {opt[:80]!r}")
    for opt, want in meant.items():
        if opt not in seen:
            problems.append(f"{opt} missing")
        elif want is not None and seen[opt] != want:
            problems.append(f"{opt} is {str(seen[opt])[:80]!r}, meant {want[:80]!r}")
    out = seen.get("--output")
    if out is not None:
        got = slurm_filename(out)
        want_path = f"{job_dir}/{role}-{JOB_ID}.out"
        if got != want_path:
            problems.append(f"--output expands to {str(got)[:100]!r}, meant {want_path[:100]!r}")
    return problems


# -- the bash oracle -------------------------------------------------------------------------------------------
STUB = r"""
__rec() { for a in "$@"; do printf '%s\0' "$a"; done >> "$KTD_REC"; printf '\001END\0' >> "$KTD_REC"; }
docker() { __rec docker "$@"; return 0; }
mkdir() { __rec mkdir "$@"; return 0; }
hostname() { echo node1; }
id() { case "$1" in -u) echo 1000;; -g) echo 1000;; *) echo uid=1000;; esac; }
SLURM_JOB_ID=@JOB@
""".replace("@JOB@", JOB_ID)


def bash_calls(script: str, tmp: Path) -> tuple[list[list[str]], list[str]]:
    """The docker/mkdir argvs of ``script``'s body run with stubs (lines that write files dropped)."""
    problems: list[str] = []
    path = tmp / "job.sbatch"
    path.write_text(script)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        problems.append(f"bash -n: {r.stderr.strip()[:200]}")
        return [], problems
    body = [ln for ln in script.split("\n") if "base64 -d >" not in ln]
    (tmp / "run.sh").write_text(STUB + "\n".join(body[1:]) + "\n")
    rec = tmp / "rec"
    rec.write_bytes(b"")
    r = subprocess.run(["bash", str(tmp / "run.sh")], capture_output=True, timeout=20, cwd=tmp,
                       env={"PATH": "/usr/bin:/bin", "KTD_REC": str(rec)})
    calls: list[list[str]] = [[]]
    for item in rec.read_bytes().split(b"\0")[:-1]:
        if item == b"\x01END":
            calls.append([])
        else:
            calls[-1].append(item.decode("utf-8", "surrogateescape"))
    return [c for c in calls if c], problems


def judge_bash(script: str, expected: list[list[str]], tmp: Path) -> list[str]:
    """Each expected argv (placeholders already filled) must be the tail of one recorded docker call."""
    calls, problems = bash_calls(script, tmp)
    if problems:
        return problems
    for want in expected:
        if not any(c[:2] == want[:2] and c[-(len(want) - 2):] == want[2:] for c in calls):
            near = [c for c in calls if c[:2] == want[:2]]
            problems.append(f"no call {shlex.join(want)[:160]!r}; got {shlex.join(near[0])[:160] if near else None!r}")
    return problems


# -- the k8s oracle ---------------------------------------------------------------------------------------------
def judge_k8s(docs: list[dict], text: str, shipped: dict) -> list[str]:
    problems: list[str] = []
    try:
        back = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        return [f"yaml.safe_load_all fails: {str(e)[:200]}"]
    if back != docs:
        problems.append("manifests load back to other objects: " + _first_diff(docs, back))
    why = _yaml_back(docs[0]["data"]["recipe.yaml"], shipped)
    if why:
        problems.append("ConfigMap recipe.yaml: " + why)
    return problems


def _yaml_back(text: str, doc: dict) -> str | None:
    """Why ``text`` (a dumped recipe) does not load back to ``doc`` with PyYAML and with ktdeploy's own loader
    (the one the container reads its recipe with), or None."""
    from ktdeploy.core.recipe.loader import parse_recipe_text

    try:
        back = yaml.safe_load(text)
        own = parse_recipe_text(text).doc
    except Exception as e:  # noqa: BLE001 - any failure to read it back is the finding
        return f"fails to load: {str(e)[:200]}"
    if back != doc:
        return "PyYAML loads another recipe: " + _first_diff(doc, back)
    if own != doc:
        return "ktdeploy's loader loads another recipe: " + _first_diff(doc, own)
    return None


def _first_diff(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b or a[k] != b[k]:
                return _first_diff(a.get(k), b.get(k), f"{path}.{k}")
        return path
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_diff(x, y, f"{path}[{i}]")
    return f"{path}: {a!r:.80} -> {b!r:.80}"


# -- one case ----------------------------------------------------------------------------------------------------
@dataclass
class Report:
    generated: int = 0
    accepted: int = 0
    rendered: int = 0
    escapes: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)   # class -> (target, value, why)

    def add(self, cls: str, target: str, value: str, why: str) -> None:
        self.escapes.setdefault(cls, []).append((target, value, why))

    def summary(self) -> str:
        lines = [f"generated {self.generated}, accepted by check {self.accepted}, rendered {self.rendered}, "
                 f"escapes {sum(len(v) for v in self.escapes.values())} in {len(self.escapes)} class(es)"]
        for cls, items in sorted(self.escapes.items()):
            t, v, why = items[0]
            lines.append(f"  [{cls}] x{len(items)}  e.g. {t} = {v[:60]!r}: {why[:200]}")
        return "\n".join(lines)


def _load(case: Case, tmp: Path) -> Any:
    from ktdeploy.core.recipe.document import load_recipe

    name = case.stem.replace("/", "_").replace("\0", "_")[:120] or "x"
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(case.doc, allow_unicode=False, width=10**9))
    return load_recipe(p, case.overrides)


def judge_case(case: Case, report: Report, tmp: Path) -> None:
    from ktdeploy.core.errors import KtdeployError
    from ktdeploy.core.plan import docker_argv as dk
    from ktdeploy.core.plan.host_plan import job_name, output_dir_of, shipped_recipe
    from ktdeploy.core.recipe.validate import require_valid
    from ktdeploy.core.sched.batch import job_dir_of
    from ktdeploy.core.sched.job_files import image_and_variant, k8s_manifests, slurm_scripts
    from ktdeploy.core.sched.k8s import render_yaml

    t, v = case.target, case.value
    try:
        recipe = _load(case, tmp)
        require_valid(recipe)
    except (KtdeployError, OSError, UnicodeError, yaml.YAMLError):
        return   # refused by check (or no such file name): not accepted
    report.accepted += 1
    # the Slurm scripts
    try:
        jobs = slurm_scripts(recipe, case.variant, runtime="docker")   # the oracle below replays docker's argv
    except KtdeployError:
        jobs = None   # refused with ktdeploy's own error (a key and a fix): no escape
    except Exception as e:  # noqa: BLE001 - a traceback for a recipe check accepted
        report.add("render --slurm crashes on an accepted value", t, v, f"{type(e).__name__}: {e}"[:200])
        jobs = None
    if jobs is not None:
        report.rendered += 1
        name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
        sched = recipe.deploy.scheduler
        image, _variant = image_and_variant(recipe, case.variant)
        vol = recipe.deploy.volumes
        from ktdeploy.core.job_layout import JobLayout

        for job in jobs:
            header = judge_sbatch(job.script, name=name, role=job.role, job_dir=job_dir,
                                  partition=sched.partition, account=sched.account)
            if any("hetjob separator" in why for why in header):   # the other differences follow from the split
                report.add(HETJOB, t, v, f"{job.role}.sbatch: " + "; ".join(header))
            for why in header if not any("hetjob separator" in w for w in header) else []:
                report.add("sbatch header: options differ from ktdeploy's", t, v, f"{job.role}.sbatch: {why}")
            if job.role == "train":
                shipped_b64 = re.search(r"^echo '?([A-Za-z0-9+/=]+)'? \| base64 -d", job.script, re.M)
                if shipped_b64 is None:
                    report.add("batch script body: a value is not one word", t, v, "no shipped recipe line")
                else:
                    why = _yaml_back(base64.b64decode(shipped_b64.group(1)).decode(), shipped_recipe(recipe, None))
                    if why:
                        report.add(NEL, t, v,
                                   "batch script's shipped recipe: " + why)
                cname = f"{name}-j{JOB_ID}"
                create = dk.create_train(name=cname, image=image, run_id="manual", volumes=vol, output_dir=out,
                                         gpus=None, memlock=True, user=None)
                ship = f"{job_dir}/ship"
                expected = [create[:2] + create[2:], ["mkdir", "-p", "--", ship],
                            dk.copy_job(ship, cname)]
            else:
                cname = f"{name}-convert-j{JOB_ID}"
                run = dk.run_convert(name=cname, image=image, run_id="manual", volumes=vol, output_dir=out,
                                     adapter_dir=JobLayout(out).adapter_dir, user=None)
                expected = [run[:2] + run[3:]]   # the allocation's flags go after --rm
            try:
                problems = judge_bash(job.script, expected, tmp)
            except subprocess.TimeoutExpired:
                problems = ["bash stub run timed out"]
            for why in problems:
                report.add("batch script body: a value is not one word", t, v, why)
    # the Kubernetes manifests
    try:
        docs = k8s_manifests(recipe, case.variant, case.namespace)
    except KtdeployError:
        return
    except Exception as e:  # noqa: BLE001
        report.add("render --k8s crashes on an accepted value", t, v, f"{type(e).__name__}: {e}"[:200])
        return
    try:
        text = render_yaml(docs)
    except Exception as e:  # noqa: BLE001
        report.add("render --k8s crashes on an accepted value", t, v, f"{type(e).__name__}: {e}"[:200])
        return
    for why in judge_k8s(docs, text, shipped_recipe(recipe, None)):
        cls = (NEL if why.startswith("ConfigMap")
               else "k8s YAML does not load back to the same value")
        report.add(cls, t, v, why)


def run(n: int = 1000, seed: int = 4, only: Callable[[str, str], bool] | None = None) -> Report:
    report = Report()
    base = _base()
    with tempfile.TemporaryDirectory(prefix="ktd-probe4-") as d:
        for target, value in values(n, seed):
            if only is not None and not only(target, value):
                continue
            report.generated += 1
            case = Case(target=target, value=value, doc=copy.deepcopy(base))
            TARGETS[target](case)
            sub = Path(d) / str(report.generated)
            sub.mkdir()
            judge_case(case, report, sub)
            for f in sub.iterdir():
                f.unlink()
            sub.rmdir()
    return report


if __name__ == "__main__":
    import sys

    rep = run(int(sys.argv[1]) if len(sys.argv) > 1 else 1200, int(os.environ.get("SEED", "4")))
    print(rep.summary())
