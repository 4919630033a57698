"""The independent oracle, end to end: generate cases, ask `ktdeploy check`, ask the real stack, compare.

    .venv/bin/python -m tests.oracle.harness --seed 20261204 -n 2500 [--image ktsft:amx] \
        [--out bench/results/oracle-independent]

1. ``prepare``: independent_gen.cases(seed, n) plus the shipped recipes as controls; each recipe is written as YAML,
   loaded and validated by ktdeploy (``load_recipe`` + ``validate``: what ``ktdeploy check`` runs, its exit code is
   2 exactly when an error finding or a load error comes back) and rendered by ktdeploy's ``render`` (what ``up``
   launches) into train.yaml + accelerate.yaml. A recipe ktdeploy cannot load is handed to the stack as its two
   sections written out verbatim (what a user would give LlamaFactory and accelerate directly).
2. ``judge``: one ``docker run`` of the full image, one Python process for all cases (stack_judge.py).
3. ``compare``: agree / ktdeploy-looser (check passes, the stack refuses: the bug class) / ktdeploy-stricter
   (check refuses, the stack accepts); looser cases grouped by the component that refused and its message.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.oracle import independent_gen as gen

REPO = gen.REPO
MODELS = REPO / "recipes" / "models"


# ---------------------------------------------------------------- 1. ktdeploy's verdict and rendering

def ktdeploy_verdict(recipe_path: Path) -> tuple[dict, Any]:
    from ktdeploy.core.errors import KtdeployError
    from ktdeploy.core.recipe import errors, load_recipe, validate

    try:
        recipe = load_recipe(recipe_path)
        findings = validate(recipe)
    except KtdeployError as err:
        found = [{"path": f.path, "message": f.message} for f in getattr(err, "findings", [])] or \
            [{"path": "(document)", "message": err.message}]
        return {"valid": False, "load_error": True, "errors": found[:8], "n_errors": len(found), "warnings": 0}, None
    except Exception as exc:  # check itself crashed: `ktdeploy check` would not give a clean verdict either
        return {"valid": False, "load_error": True, "crash": f"{type(exc).__name__}: {exc}"[:300],
                "errors": [{"path": "(crash)", "message": f"{type(exc).__name__}: {exc}"[:300]}], "n_errors": 1,
                "warnings": 0}, None
    errs = errors(findings)
    return {"valid": not errs, "load_error": False, "errors": [{"path": f.path, "message": f.message} for f in errs[:8]],
            "n_errors": len(errs), "warnings": len(findings) - len(errs)}, recipe


def _model_config_for(recipe: dict, base: str, bases: dict[str, dict]) -> str | None:
    for source in (recipe, bases.get(base, {})):
        name = str((source.get("train") or {}).get("model_name_or_path", "")).rstrip("/").split("/")[-1]
        path = MODELS / f"{name}.json"
        if name and path.is_file():
            return str(path.relative_to(REPO))
    return None


def prepare_cases(items: list[tuple[str, dict, str]], work: Path) -> list[dict]:
    """Write, check and render each ``(case_id, recipe, description)``; returns the manifest entries."""
    from ktdeploy.core.recipe import render

    bases = gen.base_recipes("issue49")  # every profile's bases (a superset of v1's)
    cases_dir = work / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for case_id, recipe, desc in items:
        d = cases_dir / case_id
        d.mkdir(exist_ok=True)
        (d / "recipe.yaml").write_text(gen.dump_recipe(recipe))
        verdict, loaded = ktdeploy_verdict(d / "recipe.yaml")
        rendered_by = "ktdeploy render"
        launch_env: dict[str, str] = {}
        try:
            if loaded is None:
                raise ValueError("not loadable")
            r = render(loaded)
            train_text, acc_text = r.train_yaml, r.accelerate_yaml
            launch_env = dict(r.env)
        except Exception:
            rendered_by = "sections written verbatim"
            train_text = gen.dump_section(recipe.get("train") or {})
            acc_text = gen.dump_section(recipe.get("accelerate") or {})
            gpus = (recipe.get("deploy") or {}).get("gpus")
            if isinstance(gpus, list):
                launch_env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
        (d / "train.yaml").write_text(train_text)
        (d / "accelerate.yaml").write_text(acc_text)
        try:
            use_kt_raw = (yaml.safe_load(train_text) or {}).get("use_kt") is True
        except Exception:
            use_kt_raw = False
        base = desc.split(":", 1)[0]
        entries.append({"case_id": case_id, "description": desc, "base": base,
                        "train_yaml": f"{case_id}/train.yaml", "accelerate_yaml": f"{case_id}/accelerate.yaml",
                        "launch_env": launch_env, "model_config": _model_config_for(recipe, base, bases),
                        "use_kt_raw": use_kt_raw, "rendered_by": rendered_by, "ktdeploy": verdict,
                        "diff": [diff_text(x) for x in leaf_diffs(bases.get(base, {}), recipe)]})
    return entries


def write_manifest(work: Path, entries: list[dict], **meta) -> dict:
    manifest = {**meta, "cases": entries}
    (work / "cases" / "manifest.json").write_text(json.dumps(manifest, indent=0) + "\n")
    return manifest


def prepare(seed: int, n: int, work: Path, profile: str = "v1") -> dict:
    bases = gen.base_recipes(profile)
    items = [(f"control-{name}", rec, f"{name}: unchanged shipped recipe") for name, rec in sorted(bases.items())]
    t0 = time.monotonic()
    items += gen.cases(seed, n, profile)
    t_gen = time.monotonic() - t0
    t0 = time.monotonic()
    entries = prepare_cases(items, work)
    return write_manifest(work, entries, seed=seed, n=n, profile=profile, generate_seconds=round(t_gen, 2),
                          check_render_seconds=round(time.monotonic() - t0, 2))


# ---------------------------------------------------------------- leaf differences (for minimising looser cases)

_SECTION_DICTS = {("train",), ("train", "kt_config"), ("accelerate",), ("accelerate", "fsdp_config"), ("deploy",)}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def leaf_diffs(base: dict, recipe: dict, prefix: tuple = ()) -> list[tuple[tuple, str, Any]]:
    """What changed from ``base`` to ``recipe``, one entry per key: (path, "set"|"del", value)."""
    out: list[tuple[tuple, str, Any]] = []
    for key in list(base) + [k for k in recipe if k not in base]:
        path = (*prefix, key)
        if key not in recipe:
            out.append((path, "del", None))
        elif key not in base:
            out.append((path, "set", recipe[key]))
        elif path in _SECTION_DICTS and isinstance(base[key], dict) and isinstance(recipe[key], dict):
            out += leaf_diffs(base[key], recipe[key], path)
        elif not _same(base[key], recipe[key]) or (isinstance(base[key], (list, dict)) and
                                                     gen.dump_recipe({"v": base[key]}) != gen.dump_recipe({"v": recipe[key]})):
            out.append((path, "set", recipe[key]))
    return out


def diff_text(d: tuple[tuple, str, Any]) -> str:
    path, op, value = d
    dotted = ".".join(str(p) for p in path)
    return f"drop {dotted}" if op == "del" else f"{dotted}={gen._show(value)}"


def apply_diffs(base: dict, diffs: list[tuple[tuple, str, Any]]) -> dict:
    import copy

    out = copy.deepcopy(base)
    for path, op, value in diffs:
        node = out
        for p in path[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        if op == "del":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------- 2. the real stack

def run_judge(work: Path, image: str, per_case: float, timeout: float, name: str, local_python: str | None = None,
              workers: int = 0) -> Path:
    """One judge process for every case (``workers`` forked after its imports; 0: one per CPU): in a container of
    ``image``, or with ``local_python`` an interpreter on this machine that has the stack's pinned wheels."""
    out = work / "stack.json"
    rel_cases = (work / "cases").resolve().relative_to(REPO)
    rel_out = out.resolve().relative_to(REPO)
    judge = ["-m", "tests.oracle.stack_judge", str(rel_cases), str(rel_out), str(per_case)]
    if local_python:
        argv = [local_python, *judge]
        env = {**os.environ, "PYTHONPATH": str(REPO), "ORACLE_JUDGE_WORKERS": str(workers)}
    else:
        argv = ["docker", "run", "--rm", "--name", name, "--user", "0", "--memory", "8g", "--network", "none",
                "-v", f"{REPO}:/src", "-w", "/src", "-e", "PYTHONPATH=/src", "-e", f"ORACLE_JUDGE_WORKERS={workers}",
                "--entrypoint", "python3", image, *judge]
        env = None
    log = work / "judge.log"
    with log.open("w") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False, cwd=REPO,
                              env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the stack judge failed (exit {proc.returncode}); see {log}")
    return out


# ---------------------------------------------------------------- 3. compare

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_NUM = re.compile(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e[-+]?\d+)?")
_PATH = re.compile(r"(/[\w.\-]+)+")
_LEADING_VALUE = re.compile(r"^.*? (is not a valid \w+)")
_TAIL_VALUE = re.compile(r"^(invalid truth value|Invalid auto wrap policy:|Unknown mixed_precision mode:|"
                         r"Unknown dynamo backend:|Unsupported nproc_per_node value:) .*?(\.|$)")
_ENUM = re.compile(r"\b[A-Z][A-Za-z]+\.[A-Z][A-Z0-9_]+\b")


def template(message: str) -> str:
    """A refusal message with its values folded, so one rule's refusals group together."""
    text = _PATH.sub("<path>", message or "")
    text = _ENUM.sub("<enum>", text)
    text = _LEADING_VALUE.sub(r"<v> \1", text)
    text = _TAIL_VALUE.sub(r"\1 <v>\2", text)
    text = _QUOTED.sub("<v>", text)
    text = _NUM.sub("<n>", text)
    text = re.sub(r"<v>(, <v>)+", "<v>…", text)  # lists of values: their length is a value too
    return " ".join(text.split())[:200]


def classify(entry: dict, stack: dict) -> str:
    passes = entry["ktdeploy"]["valid"]
    accepts = stack["verdict"] == "accept"
    if passes == accepts:
        return "agree"
    return "ktdeploy-looser" if passes else "ktdeploy-stricter"


def _key_of(diff: str) -> str:
    return diff[5:] if diff.startswith("drop ") else diff.split("=", 1)[0]


def looser_entries(manifest: dict, stack_doc: dict) -> list[dict]:
    by_id = {r["case_id"]: r for r in stack_doc["results"]}
    return [e for e in manifest["cases"] if classify(e, by_id[e["case_id"]]) == "ktdeploy-looser"]


def _same_refusal(sub: dict, orig: dict) -> bool:
    comp = orig["first_refusal"]
    return sub["verdict"] == "refuse" and sub["first_refusal"] == comp and \
        template(sub["stages"][comp].get("message", "")) == template(orig["stages"][comp].get("message", ""))


def minimise(manifest: dict, stack_doc: dict, work: Path, run) -> dict[str, list[str]]:
    """The culprit of each looser case: the smallest set of its changes (one, else two) that, applied alone to its
    shipped recipe, check still passes and the same stack component refuses with the same message. Found by
    re-running single changes (round 1) and pairs (round 2) through check and the judge."""
    import itertools

    bases = gen.base_recipes("issue49")
    recipes = {cid: rec for cid, rec, _ in gen.cases(manifest["seed"], manifest["n"], manifest.get("profile", "v1"))}
    by_id = {r["case_id"]: r for r in stack_doc["results"]}
    todo = {e["case_id"]: (e["base"], leaf_diffs(bases[e["base"]], recipes[e["case_id"]]))
            for e in looser_entries(manifest, stack_doc) if not e["case_id"].startswith("control-")}
    culprits: dict[str, list[str]] = {}
    for cid, (_base, diffs) in list(todo.items()):
        if len(diffs) == 1:
            culprits[cid] = [diff_text(diffs[0])]
    for round_no, size in ((1, 1), (2, 2)):
        items, owners = [], {}
        for cid, (base, diffs) in todo.items():
            if cid in culprits or len(diffs) <= size:
                continue
            for j, combo in enumerate(itertools.combinations(diffs, size)):
                sub_id = f"{cid}~{round_no}.{j}"
                text = " + ".join(diff_text(d) for d in combo)
                items.append((sub_id, apply_diffs(bases[base], list(combo)), f"{base}: only {text}"))
                owners[sub_id] = (cid, [diff_text(d) for d in combo])
        if not items:
            continue
        mwork = work / f"minimise-{round_no}"
        entries = prepare_cases(items, mwork)
        write_manifest(mwork, entries, seed=manifest["seed"], n=len(entries))
        sub_by_id = {r["case_id"]: r for r in run(mwork)["results"]}
        found: dict[str, list[list[str]]] = collections.defaultdict(list)
        for sub in entries:
            owner, texts = owners[sub["case_id"]]
            if sub["ktdeploy"]["valid"] and _same_refusal(sub_by_id[sub["case_id"]], by_id[owner]):
                found[owner].append(texts)
        for owner, sets in found.items():
            culprits[owner] = sorted(sets, key=lambda t: [_key_of(x) for x in t])[0]
    for cid, (_base, diffs) in todo.items():
        if cid not in culprits:
            culprits[cid] = [diff_text(d) for d in diffs] + ["(no smaller set reproduces it)"]
    return culprits


ISSUE49_CLASSES = ("lora null", "adapter flags", "prefetch", "ddp backend", "infer backend", "modules", "kt dims",
                   "model")


def mutation_classes(description: str) -> set[str]:
    """Issue 49's classes among a case's changes (the prefix each of its mutations writes)."""
    parts = description.split(": ", 1)[-1].split(" | ")
    return {c for c in ISSUE49_CLASSES for part in parts if part.startswith(c + ": ")}


def compare(manifest: dict, stack_doc: dict, culprits: dict[str, list[str]] | None = None) -> dict:
    culprits = culprits or {}
    by_id = {r["case_id"]: r for r in stack_doc["results"]}
    rows = []
    for e in manifest["cases"]:
        s = by_id[e["case_id"]]
        first = s["first_refusal"]
        refusal = s["stages"][first] if first else None
        rows.append({
            "case_id": e["case_id"], "description": e["description"], "control": e["case_id"].startswith("control-"),
            "class": classify(e, s), "check_valid": e["ktdeploy"]["valid"], "check_load_error": e["ktdeploy"]["load_error"],
            "check_errors": e["ktdeploy"]["errors"][:2], "stack_verdict": s["verdict"],
            "stack_partial": s.get("partial", False), "stack_component": first,
            "stack_type": refusal.get("type") if refusal else None,
            "stack_message": refusal.get("message") if refusal else None,
            "stack_at": refusal.get("at") if refusal else None, "rendered_by": e["rendered_by"],
            "diff": e.get("diff", []), "culprit": culprits.get(e["case_id"]), "seconds": s["seconds"]})
    generated = [r for r in rows if not r["control"]]
    counts = collections.Counter(r["class"] for r in generated)
    looser_groups: dict[tuple, list] = collections.defaultdict(list)
    for r in generated:
        if r["class"] == "ktdeploy-looser":
            culprit = [c for c in (r["culprit"] or []) if not c.startswith("(")]
            key = " + ".join(sorted({_key_of(c) for c in culprit})) or "?"
            if r["culprit"] and r["culprit"][-1].startswith("("):
                key = "(all of its changes)"
            looser_groups[(r["stack_component"], template(r["stack_message"] or ""), key)].append(r)
    looser = []
    for (component, tmpl, key), members in sorted(looser_groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        values = collections.Counter(" + ".join(m["culprit"] or []) for m in members)
        looser.append({"component": component, "culprit_key": key, "message_template": tmpl, "count": len(members),
                       "type": members[0]["stack_type"], "message": members[0]["stack_message"],
                       "at": members[0]["stack_at"], "culprit_values": [v for v, _ in values.most_common(8)],
                       "examples": [{"case_id": m["case_id"], "description": m["description"], "culprit": m["culprit"]}
                                    for m in members[:3]]})
    stricter_groups: dict[str, list] = collections.defaultdict(list)
    for r in generated:
        if r["class"] == "ktdeploy-stricter":
            first_err = r["check_errors"][0] if r["check_errors"] else {"path": "?", "message": ""}
            path = re.sub(r"\[\d+\]", "[]", first_err["path"])
            stricter_groups[f"{path}: {template(first_err['message'])[:140]}"].append(r)
    stricter = [{"ktdeploy_error": k, "count": len(v), "partial": sum(1 for m in v if m["stack_partial"]),
                 "examples": [{"case_id": m["case_id"], "description": m["description"]} for m in v[:3]]}
                for k, v in sorted(stricter_groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    exc_types = collections.Counter((r["stack_component"], r["stack_type"]) for r in generated if r["stack_type"])
    by_class: dict[str, dict[str, int]] = {}
    for r in generated:
        for cls in mutation_classes(r["description"]):
            row = by_class.setdefault(cls, {"generated": 0, "stack_refused": 0, "looser": 0, "stricter": 0})
            row["generated"] += 1
            row["stack_refused"] += r["stack_verdict"] == "refuse"
            row["looser"] += r["class"] == "ktdeploy-looser"
            row["stricter"] += r["class"] == "ktdeploy-stricter"
    plain = [r for r in generated if not gen.model_dependent(r["description"])]
    return {
        "profile": manifest.get("profile", "v1"), "partial_of": manifest.get("partial_of"),
        "by_class": dict(sorted(by_class.items())),
        "plain_cases": len(plain), "plain_looser": sum(r["class"] == "ktdeploy-looser" for r in plain),
        "model_dependent_cases": len(generated) - len(plain),
        "model_dependent_looser": sum(r["class"] == "ktdeploy-looser" for r in generated) -
        sum(r["class"] == "ktdeploy-looser" for r in plain),
        "seed": manifest["seed"], "n": manifest["n"], "counts": dict(counts),
        "stricter_partial": sum(1 for r in generated if r["class"] == "ktdeploy-stricter" and r["stack_partial"]),
        "controls": [{k: r[k] for k in ("case_id", "class", "stack_verdict", "check_valid", "stack_message")}
                     for r in rows if r["control"]],
        "stack_refusals_by_component": dict(collections.Counter(r["stack_component"] for r in generated
                                                                if r["stack_component"])),
        "looser_by_component": dict(collections.Counter(r["stack_component"] for r in generated
                                                        if r["class"] == "ktdeploy-looser")),
        "stack_exception_types": [{"component": c, "type": t, "count": n} for (c, t), n in exc_types.most_common()],
        "looser_classes": looser, "stricter_groups": stricter,
        "timing": {"generate_seconds": manifest["generate_seconds"], "check_render_seconds": manifest["check_render_seconds"],
                   "stack_import_seconds": stack_doc["import_seconds"], "stack_total_seconds": stack_doc["total_seconds"],
                   "stack_max_case_seconds": max(r["seconds"] for r in rows),
                   "per_case_limit_seconds": stack_doc["per_case_limit_seconds"]},
        "versions": stack_doc["versions"], "cases": rows}


# ---------------------------------------------------------------- report

def _md_escape(text: str) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


ISSUE49_TEXT = {
    "lora null": "`lora_target: null` (LlamaFactory keeps None; adapter setup takes its len())",
    "adapter flags": "`use_dora`/`use_rslora`/`pissa_init`/`loraplus_lr_ratio` with full/freeze/LoRA tuning",
    "prefetch": "`dataloader_prefetch_factor` with `dataloader_num_workers` 0/unset/>0",
    "ddp backend": "`ddp_backend`: transformers' choices and names torch does not know",
    "infer backend": "`infer_backend` (huggingface/vllm/sglang and spellings)",
    "modules": "`lora_target`/`additional_target`/`modules_to_save` naming modules the model has or lacks",
    "kt dims": "kt-kernel pools (`kt_threadpool_count`, `kt_num_threads`, `kt_tp_enabled`, format) vs the model's sizes",
    "model": "`model_name_or_path` pointed at another architecture's config.json",
}


def issue49_md(res: dict) -> list[str]:
    """The per-class table of profile issue49 (a case with several classes counts in each)."""
    if res.get("profile") != "issue49":
        return []
    lines = ["## Issue 49's classes", "",
             f"Plain `check` is judged on the cases without a model-dependent change: **{res['plain_cases']}** cases, "
             f"**{res['plain_looser']}** looser. The **{res['model_dependent_cases']}** cases with a model-dependent "
             f"change (modules, kt dims, model) have **{res['model_dependent_looser']}** looser for plain check "
             "(which is not given the config.json); `check --stack --model-config` is judged on them separately "
             "(below, when run).", "",
             "| class | what | cases | refused by the real stack | looser (plain check) | stricter |",
             "|---|---|---:|---:|---:|---:|"]
    for cls in ISSUE49_CLASSES:
        row = res["by_class"].get(cls, {})
        lines.append(f"| {cls} | {ISSUE49_TEXT[cls]} | {row.get('generated', 0)} | {row.get('stack_refused', 0)} | "
                     f"{row.get('looser', 0)} | {row.get('stricter', 0)} |")
    stack_check = res.get("stack_check")
    if stack_check:
        lines += ["", f"`check --stack --model-config`: {stack_check}"]
    return lines + [""]


def report_md(res: dict, image: str, image_id: str) -> str:
    c = res["counts"]
    total = sum(c.values())
    lines = [
        "# Independent recipe oracle: `ktdeploy check` against the real stack",
        "",
        f"Seed **{res['seed']}**, **{total}** generated cases (+ {len(res['controls'])} shipped recipes as controls), "
        f"image `{image}` (`{image_id[:19]}`); stack: {', '.join(f'{k} {v}' for k, v in res['versions'].items())}. "
        "Machine-readable: `results.json` (every case: its changes, both verdicts, the refusing component and message).",
        "",
        *([f"**Partial run**: the {total + len(res['controls'])} cases the judge finished of the "
           f"{res['partial_of']} prepared (the judge takes the heaviest model configs first, so the finished cases "
           "lean to the big models); looser cases were not minimised.", ""]
          if res.get("partial_of") and res["partial_of"] > total + len(res["controls"]) else []),
        "| class | cases |", "|---|---:|",
        f"| agree | {c.get('agree', 0)} |",
        f"| **ktdeploy-looser** (check passes, the stack refuses: the bug class) | **{c.get('ktdeploy-looser', 0)}** |",
        f"| ktdeploy-stricter (check refuses, the stack accepts) | {c.get('ktdeploy-stricter', 0)} |",
        "",
        f"Of the stricter cases, {res['stricter_partial']} set a non-sft `stage`, whose workflow the judge does not "
        "follow past its entry (accepted there, so only partly judged).",
        "",
        "Controls (each shipped recipe unchanged): " + ", ".join(
            f"`{x['case_id'][8:]}` {x['class']} ({x['stack_verdict']})" for x in res["controls"]) + ".",
        "",
        "Looser cases by the component that refused first: " + ", ".join(
            f"{k} {v}" for k, v in sorted(res["looser_by_component"].items(), key=lambda kv: -kv[1])) + "; "
        "all stack refusals: " + ", ".join(
            f"{k} {v}" for k, v in sorted(res["stack_refusals_by_component"].items(), key=lambda kv: -kv[1])) + ".",
        "",
        *([res["note"], ""] if res.get("note") else []),
        *issue49_md(res),
        "## Method",
        "",
        METHOD.strip(),
        "",
        "## ktdeploy-looser classes",
        "",
        "One class = the component that refused first, its message with values folded, and the culprit key: the "
        "single change that, applied alone to the shipped recipe, check still passes and the same component refuses "
        "with the same message (found by re-running each change of a multi-change case on its own).",
        "",
        "| # | cases | component | culprit key | culprits seen | the stack's message (first case) |",
        "|---:|---:|---|---|---|---|",
    ]
    for i, cls in enumerate(res["looser_classes"], 1):
        vals = "<br>".join(f"`{_md_escape(v)[:90]}`" for v in cls["culprit_values"][:4])
        lines.append(f"| L{i} | {cls['count']} | {cls['component']} | `{_md_escape(cls['culprit_key'])}` | {vals} | "
                     f"{_md_escape(cls['type'])}: {_md_escape((cls['message'] or '')[:220])} |")
    lines += ["", "### Examples (first case of each class)", ""]
    for i, cls in enumerate(res["looser_classes"], 1):
        ex = cls["examples"][0]
        lines.append(f"- **L{i}** `{ex['case_id']}` ({_md_escape(cls['at'] or '')}): {_md_escape(ex['description'])}")
    lines += ["", "## ktdeploy-stricter, by ktdeploy's first error", "",
              "Where check refuses and every stage of the judge accepts. Not all of these are wrong: the stack checks "
              "few value types when it starts (a string where a number belongs often passes start-up and fails later).",
              "",
              "| cases | of which non-sft stage | ktdeploy's first error (key: message) | example |", "|---:|---:|---|---|"]
    for g in res["stricter_groups"][:60]:
        ex = g["examples"][0]
        lines.append(f"| {g['count']} | {g['partial']} | {_md_escape(g['ktdeploy_error'])} | `{ex['case_id']}`: "
                     f"{_md_escape(ex['description'])[:150]} |")
    if len(res["stricter_groups"]) > 60:
        rest = res["stricter_groups"][60:]
        lines.append(f"| {sum(g['count'] for g in rest)} | | {len(rest)} more groups (results.json) | |")
    t = res["timing"]
    lines += ["", "## Timing", "",
              f"Generation {t['generate_seconds']} s; ktdeploy check + render {t['check_render_seconds']} s (host, one "
              f"process); the stack judge {t['stack_total_seconds']} s in one container process (imports "
              f"{t['stack_import_seconds']} s; slowest case {t['stack_max_case_seconds']} s; limit "
              f"{t['per_case_limit_seconds']} s per case); minimising the looser cases: two more judge runs (single changes, then pairs) "
              f"({res.get('minimise_cases', 0)} cases of one or two changes, {res.get('minimise_seconds', 0)} s "
              f"including their check and render). Host: {t.get('host', '?')}.", "",
              "Reproduce (needs the full image; rewrites this folder): `.venv/bin/python -m tests.oracle.harness "
              f"--seed {res['seed']} -n {res['n']}`.", ""]
    return "\n".join(lines)


METHOD = """
The cases come from `tests/oracle/independent_gen.py`, written without reading ktdeploy's rules or its key catalogue:
each is one shipped recipe (recipes/*.yaml) with 1-4 random mutations (seeded; case *i* is drawn from the seed and
*i*, again if it repeats an earlier case; prefix-stable) drawn from the real stack's own argument definitions, which `tests/oracle/extract_stack_catalog.py` dumps from
the wheels in the image (LlamaFactory's Model/Data/Finetuning/Generating arguments and transformers-kt's
TrainingArguments, kt-kernel's KTConfig, accelerate's ClusterConfig and launch arguments: names, types, choices):
valid values, wrong types, case/whitespace variants of choices, YAML 1.1 spellings (`yes`/`off`/`~`/`0x10`/`1e3`/
`'08'`), boundary numbers, lists for scalars and back, dropped and misspelt keys, keys in the wrong section, and
cross-key scenarios (evaluation without eval data, streaming without max_steps, LoRA with GaLore/APOLLO/BAdam,
quantization with full tuning, FSDP settings without `fsdp_version: 2`, distributed_type variants, kt-kernel
format/backend/lifecycle/GPU-expert combinations, report_to and optional-package features). ktdeploy's verdict is
`load_recipe` + `validate` (the code behind `ktdeploy check`'s exit code) on the recipe file; the recipe is then
rendered with ktdeploy's `render` (what `up` launches) and the rendered train.yaml/accelerate.yaml go, all cases in
one container process with a per-case time limit, through what a training start runs (`tests/oracle/stack_judge.py`):
accelerate's launch parsing (`_validate_launch_command`, the launcher's environment, torchrun's `config_from_args`);
LlamaFactory's `run_exp` → `read_args` → `get_train_args` in the rank-0 environment the launcher builds; the real
`run_sft` up to the Trainer with tokenizer/dataset/model loading stood in for; inside the model-loading stand-in,
kt-kernel's `wrap_moe_layers_with_kt_wrapper` (KTConfig and every wrapper check before the layers are walked) on
the KT config LlamaFactory registered; and the FSDP plugin plus the KT plugin's `validate_distributed_setup` with
the distributed type accelerate derives on a CUDA host. Bypassed, as hardware or file gates only: the bf16/TF32 GPU
checks, `torch.cuda.current_device` in the FSDP plugin, the process group (the training-process stages see one
process; the world size goes to the plugin check), kt-kernel's kernel selection for INT8/FP8/RAWINT4/MXFP4 (the
target has AMX), and weight folders are taken to hold safetensors shards. Not run: weight and dataset loading,
the peft adapter setup, the Trainer's own init beyond its report_to callbacks, the per-layer wrapper construction.
A case is *looser* when check passes (exit 0) and some stage refuses; *stricter* when check refuses (exit 2) and
every stage accepts — note that the stack checks few value types at start-up (HfArgumentParser.parse_dict does not
convert types), so a stricter case may still fail later in training.
"""


def dump_results(res: dict) -> str:
    """The summary indented; the per-case rows one per line (a readable diff when the lead re-runs it)."""
    head = {k: v for k, v in res.items() if k != "cases"}
    text = json.dumps(head, indent=1)
    def compact(r: dict) -> dict:
        out = {k: v for k, v in r.items() if v not in (None, False, [], "ktdeploy render")}
        if r["class"] != "ktdeploy-looser":
            out.pop("diff", None)
        if r["check_errors"]:
            first = r["check_errors"][0]
            out["check_errors"] = [{"path": first["path"], "message": first["message"][:200]}]
        if r["stack_message"]:
            out["stack_message"] = r["stack_message"][:300]
        return out

    rows = ",\n".join(json.dumps(compact(r), separators=(",", ":")) for r in res["cases"])
    return text[:-2] + ',\n "cases": [\n' + rows + "\n]\n}\n"


def partial_run(work: Path, manifest: dict) -> tuple[dict, dict]:
    """The manifest cut to the cases the judge finished (its per-case parts), and a stack document for them."""
    results: dict[str, dict] = {}
    parts = sorted(work.glob("stack.part*.jsonl"))
    for part in parts:
        for line in part.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            results[rec["case_id"]] = rec
    cases = [e for e in manifest["cases"] if e["case_id"] in results]
    first = min(p.stat().st_ctime for p in parts)
    last = max(p.stat().st_mtime for p in parts)
    doc = {"versions": gen.catalog()["versions"], "import_seconds": None,
           "total_seconds": round(last - first, 1), "per_case_limit_seconds": None,
           "results": [results[e["case_id"]] for e in cases]}
    return {**manifest, "cases": cases, "partial_of": len(manifest["cases"])}, doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("-n", type=int, default=2500)
    ap.add_argument("--profile", default="v1", choices=sorted(gen.PROFILES),
                    help="the generator's mutation set: v1 (seed 20261204's record) or issue49")
    ap.add_argument("--image", default="ktsft:amx")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "oracle-independent")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "oracle-independent")
    ap.add_argument("--per-case", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--reuse", action="store_true", help="reuse WORK's cases and verdicts (compare and report only)")
    ap.add_argument("--local-python", help="judge with this interpreter (the stack's pinned wheels installed) instead "
                                           "of a container of --image")
    ap.add_argument("--workers", type=int, default=0, help="judge processes (0: one per CPU)")
    ap.add_argument("--note", default="", help="a paragraph for the report: how this run was obtained")
    ap.add_argument("--no-minimise", action="store_true", help="report the looser cases without re-running their "
                                                               "changes one by one")
    ap.add_argument("--partial", action="store_true", help="with --reuse: report on the cases judged so far "
                                                           "(the judge's per-case parts), without minimising")
    args = ap.parse_args(argv)
    image_id = subprocess.run(["docker", "image", "inspect", args.image, "--format", "{{.Id}}"], capture_output=True,
                              text=True, check=False).stdout.strip()
    if args.local_python:
        args.image, image_id = f"(no image) {args.local_python}", "local interpreter"
    if not image_id:
        print(f"image {args.image} not found: build it first (ktdeploy image build)", file=sys.stderr)
        return 2
    work = args.work.resolve()

    def judge(w: Path) -> dict:
        if not (args.reuse and (w / "stack.json").is_file()):
            run_judge(w, args.image, args.per_case, args.timeout, name=f"oracle-gen-judge-{args.seed}-{w.name}",
                      local_python=args.local_python, workers=args.workers)
        return json.loads((w / "stack.json").read_text())

    if not args.reuse:
        manifest = prepare(args.seed, args.n, work, args.profile)
        print(f"prepared {len(manifest['cases'])} cases in {work} (generate {manifest['generate_seconds']} s, "
              f"check+render {manifest['check_render_seconds']} s)")
    manifest = json.loads((work / "cases" / "manifest.json").read_text())
    if args.partial:
        manifest, stack_doc = partial_run(work, manifest)
    else:
        stack_doc = judge(work)
    t0 = time.monotonic()
    culprits = {} if args.partial or args.no_minimise else minimise(manifest, stack_doc, work, judge)
    t_min = round(time.monotonic() - t0, 1)
    res = compare(manifest, stack_doc, culprits)
    res["minimise_cases"] = sum(len(json.loads(p.read_text())["cases"])
                                for p in work.glob("minimise-*/cases/manifest.json"))
    res["minimise_seconds"] = t_min
    res["image"], res["image_id"] = args.image, image_id
    res["note"] = args.note
    res["timing"]["host"] = f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} when the report was written"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(dump_results(res))
    (args.out / "README.md").write_text(report_md(res, args.image, image_id))
    print(json.dumps(res["counts"]), "->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
