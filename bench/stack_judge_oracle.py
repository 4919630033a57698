"""The two-generator stack oracle: `ktdeploy check` vs the stack's own judgement, on thousands of recipes.

Runs INSIDE the full image (one process for every case: the stack is imported once), with this working tree
mounted:

    docker run --rm --user 0 --network none -v "$PWD":/src -w /src -e PYTHONPATH=/src \
        --entrypoint python3 ktsft:avx512 bench/stack_judge_oracle.py --fuzz 2500 --corpus \
        --json bench/results/stack-judge-oracle.json > bench/results/stack-judge-oracle.txt

Generators: ``--corpus`` = tools/stack_oracle.py's kt-kernel corpus (each kt/LoRA/precision key flipped, then
every pair, over the shipped KT recipes: 4,080 cases; ``--corpus-singles`` for its 234 single flips);
``--fuzz N`` = tools/stack_fuzz.py's random combinations written as YAML text (seed ``--seed``, default 36);
``--extra FILE`` = more (name, YAML text) cases as JSON lines (e.g. another helper's generator).

For each case: ktdeploy's verdict is `ktdeploy check` on the YAML text (errors only); the stack's is
ktdeploy.agent.stack_judge.judge on the rendered files (accelerate launch parsing + the KT plugin,
LlamaFactory's read_args -> get_train_args, kt-kernel's KTConfig + wrapper checks). Classes:

- agree: both accept, or both refuse;
- looser: ktdeploy accepts what the stack refuses (a bug: the standing test fails on any);
- stricter (explained): ktdeploy refuses what the stack accepts, and every ktdeploy error matches a row of
  docs/stack-rules.md's stricter table (rule id + message fragment, each with its reason);
- stricter (unexplained): ktdeploy refuses with an error that has no row (also a failure);
- unreadable: ktdeploy cannot read the YAML text (no rendering to judge; counted apart).

Exit 1 when any case is looser or unexplained.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))


def ktdeploy_verdict(text: str, name: str):
    """(recipe or None, ktdeploy's errors as 'rule: path: message')."""
    from ktdeploy.core.errors import RecipeError
    from ktdeploy.core.recipe.document import build
    from ktdeploy.core.recipe.loader import parse_recipe_text
    from ktdeploy.core.recipe.validate import validate

    try:
        recipe = build(parse_recipe_text(text, f"{name[:40]}.yaml"))
    except RecipeError:
        return None, []
    errs = [f"{f.rule}: {f.path}: {f.message}" for f in validate(recipe) if f.severity == "error"]
    return recipe, errs


def explained(err: str, table) -> bool:
    rule, _, rest = err.partition(":")
    return any(rule == r and frag in rest for r, frag in table)


def run_cases(cases, table, *, limit_examples: int = 8):
    from ktdeploy.agent.stack_judge import judge
    from ktdeploy.core.recipe.render import render

    counts = collections.Counter()
    looser: list[dict] = []
    unexplained = collections.defaultdict(list)
    stack_reasons = collections.Counter()
    times = []
    for name, text in cases:
        recipe, kd_errors = ktdeploy_verdict(text, name)
        if recipe is None:
            counts["unreadable"] += 1
            continue
        r = render(recipe)
        t0 = time.monotonic()
        v = judge(r.train_yaml, r.accelerate_yaml, list(r.launch_argv), dict(r.env))
        times.append(time.monotonic() - t0)
        stack_ok = not v["refusals"]
        for ref in v["refusals"]:
            stack_reasons[f"{ref['stage']}: {ref['error_type']}: {ref['message'][:110]}"] += 1
        if stack_ok == (not kd_errors):
            counts["agree"] += 1
            counts["agree (both accept)" if stack_ok else "agree (both refuse)"] += 1
        elif not stack_ok:
            counts["looser"] += 1
            looser.append({"case": name, "stack": v["refusals"]})
        else:
            bad = [e for e in kd_errors if not explained(e, table)]
            if bad:
                counts["stricter (unexplained)"] += 1
                for e in bad:
                    key = e.split(":", 1)[0] + ": " + e.split(": ", 2)[-1][:90]
                    if len(unexplained[key]) < limit_examples:
                        unexplained[key].append(name)
            else:
                counts["stricter (explained)"] += 1
    return counts, looser, unexplained, stack_reasons, times


def verdicts(cases_file: str, out_file: str) -> int:
    """Per-case verdicts for a list of (name, YAML text) JSON lines: ktdeploy's errors (rule, path, message) and the
    stack's answer; one process for all (tests/integration/test_stack_judge.py reads them). A case's optional
    ``model_config`` ({text, source}) is the config.json the judge builds the model skeleton from."""
    from ktdeploy.agent.stack_judge import judge
    from ktdeploy.core.recipe.render import render

    rows = []
    for line in Path(cases_file).read_text().splitlines():
        case = json.loads(line)
        recipe, kd = ktdeploy_verdict(case["yaml"], case["name"])
        v = None
        if recipe is not None:
            r = render(recipe)
            v = judge(r.train_yaml, r.accelerate_yaml, list(r.launch_argv), dict(r.env), case.get("model_config"))
        rows.append({"name": case["name"], "ktdeploy": kd, "stack": v})
    Path(out_file).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuzz", type=int, default=0)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--corpus", action="store_true")
    ap.add_argument("--corpus-singles", action="store_true")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--cases", help="JSON lines {name, yaml[, model_config]}: write per-case verdicts to --out instead")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.cases:
        return verdicts(a.cases, a.out)

    import stack_fuzz
    import stack_oracle

    from ktdeploy.core.recipe.render import dump_yaml

    table = stack_oracle.explained_stricter()
    generators = {}
    if a.corpus or a.corpus_singles:
        generators["kt-kernel corpus (tools/stack_oracle.py)"] = [
            (n, dump_yaml(d)) for n, d in stack_oracle.corpus(pairs=not a.corpus_singles)]
    if a.fuzz:
        generators[f"random combinations (tools/stack_fuzz.py, seed {a.seed})"] = list(stack_fuzz.cases(a.fuzz, a.seed))
    for path in a.extra:
        rows = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
        generators[f"extra ({Path(path).name})"] = [(r["name"], r["yaml"]) for r in rows]
    t0 = time.monotonic()
    report: dict = {"generators": {}}
    failed = False
    for label, cases in generators.items():
        counts, looser, unexplained, reasons, times = run_cases(cases, table)
        failed |= bool(counts["looser"] or counts["stricter (unexplained)"])
        report["generators"][label] = {
            "cases": len(cases), "counts": dict(counts), "looser": looser[:200],
            "unexplained_stricter": dict(unexplained), "stack_refusals": dict(reasons.most_common(60)),
            "judge_seconds_mean": round(sum(times) / max(len(times), 1), 4),
        }
        print(f"== {label}: {len(cases)} cases")
        for k in ("agree", "agree (both accept)", "agree (both refuse)", "stricter (explained)",
                  "stricter (unexplained)", "looser", "unreadable"):
            print(f"   {k:24s} {counts[k]}")
        print(f"   judge: {report['generators'][label]['judge_seconds_mean'] * 1000:.0f} ms per case")
        for row in looser[:40]:
            print(f"   LOOSER {row['case']}: {row['stack'][0]['stage']}: {row['stack'][0]['message'][:160]}")
        for k, names in list(unexplained.items())[:40]:
            print(f"   UNEXPLAINED {k}  e.g. {names[0]}")
    report["seconds"] = round(time.monotonic() - t0, 1)
    from ktdeploy.agent.stack_judge import versions

    report["versions"] = versions()
    print(f"total {sum(len(c) for c in generators.values())} cases in {report['seconds']} s; versions {report['versions']}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
