"""Re-judge a recorded independent-oracle run (bench/results/oracle-independent/<run>/results.json) against today's
ktdeploy, without re-running the real stack on every case: the recorded stack verdicts stay, ktdeploy's side is
asked again.

1. plain `ktdeploy check` (load_recipe + validate) on every case the record has as *looser* (check passed, the stack
   refused), regenerated from the seed (tests/oracle/independent_gen.py, prefix-stable);
2. `ktdeploy check --stack --model-config CONFIG` in the full image (tests/oracle/stack_check_batch.py, one container
   process) on those of them that still pass plain check and carry a model-dependent change.

    .venv/bin/python bench/oracle_recheck.py bench/results/oracle-independent/issue49 [--image ktsft:amx]

Writes RECHECK.md and recheck.json beside the record. The stack's verdicts are the record's: a case whose stack
verdict was itself wrong (the oracle's stand-ins) is listed with why, never counted as agreement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.oracle import harness as h  # noqa: E402
from tests.oracle import independent_gen as gen  # noqa: E402

# Cases whose recorded stack verdict was an artefact of the oracle's stand-ins, each with the evidence.
ORACLE_ARTEFACTS = {
    "KTransformers training requires a local adapter directory.":
        "a host fact, not the recipe's: the adapter path lies inside deploy.volumes and did not exist in the "
        "judge's container; check warns on it and doctor's data.start_files reads it on the host (the v1 replay's "
        "HOST_FACTS)",
    "Quantized models can only be used for the LoRA or OFT tuning.":
        "the stand-in kept a dequantized FP8 checkpoint quantized; the real load_model with the tiny FP8 weights "
        "loads full fine-tuning with no quantization_method left "
        "(tests/integration/test_stack_skeleton.py::test_a_native_fp8_checkpoint_loads_dequantized_for_full_fine_tuning); "
        "the stand-in is fixed (tests/oracle/model_setup.py)",
    "'dict' object has no attribute 'use_cache'":
        "Kimi-K2.5 is built by its checkpoint's own code (auto_map, trust_remote_code: true); the stand-in loaded "
        "the config without that code, so text_config stayed a dict; a sent config.json carries no code, so "
        "check --stack skips the skeleton and says so, and up judges it on the host with the model's directory",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path)
    ap.add_argument("--image", default="ktsft:amx")
    args = ap.parse_args(argv)
    rec = json.loads((args.record / "results.json").read_text())
    looser = {c["case_id"]: c for c in rec["cases"] if c["class"] == "ktdeploy-looser"}
    items = [(cid, r, d) for cid, r, d in gen.cases(rec["seed"], rec["n"], rec.get("profile", "v1")) if cid in looser]
    work = REPO / ".cache" / f"oracle-recheck-{args.record.name}"
    t0 = time.monotonic()
    entries = h.prepare_cases(items, work)
    h.write_manifest(work, entries, seed=rec["seed"], n=len(entries), profile=rec.get("profile"))
    t_plain = round(time.monotonic() - t0, 1)
    still = [e for e in entries if e["ktdeploy"]["valid"]]
    dependent = [e["case_id"] for e in still if gen.model_dependent(e["description"])]
    out = work / "stack-check.json"
    subprocess.run(["docker", "run", "--rm", "--user", "0", "--memory", "8g", "--network", "none", "-v",
                    f"{REPO}:/src", "-w", "/src", "-e", "PYTHONPATH=/src", "--entrypoint", "python3", args.image, "-m",
                    "tests.oracle.stack_check_batch", str((work / "cases").relative_to(REPO)),
                    str(out.relative_to(REPO)), ",".join(dependent)], check=True, timeout=7200)
    stack = {r["case_id"]: r for r in json.loads(out.read_text())["results"]}
    rows = []
    for e in entries:
        c = looser[e["case_id"]]
        s = stack.get(e["case_id"])
        if not e["ktdeploy"]["valid"]:
            verdict = "refused by plain check"
        elif s is None:
            verdict = "passes plain check (model-independent)"
        else:
            verdict = "refused by check --stack" if not s["valid"] else "passes check --stack --model-config"
        why = next((w for m, w in ORACLE_ARTEFACTS.items() if m in (c.get("stack_message") or "")), "")
        rows.append({"case_id": e["case_id"], "verdict": verdict, "model_dependent": gen.model_dependent(e["description"]),
                     "stack_message": (c.get("stack_message") or "")[:200], "oracle_artefact": why,
                     "description": e["description"][:240],
                     "first_error": (e["ktdeploy"]["errors"] or [{}])[0].get("path") if not e["ktdeploy"]["valid"]
                     else (s["errors"][0]["path"] if s and s["errors"] else None)})
    (args.record / "recheck.json").write_text(json.dumps({"commit": _commit(), "image": args.image, "cases": rows},
                                                         indent=1) + "\n")
    (args.record / "RECHECK.md").write_text(_report(rows, rec, args.image, t_plain, args.record))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in sorted({r["verdict"] for r in rows})}
    print(json.dumps(counts))
    return 0


def _commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()


def _report(rows: list[dict], rec: dict, image: str, t_plain: float, record: Path) -> str:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in sorted({r["verdict"] for r in rows})}
    open_rows = [r for r in rows if r["verdict"].startswith("passes")]
    lines = [f"# Recheck of the seed-{rec['seed']} record against ktdeploy at {_commit()}", "",
             f"`bench/oracle_recheck.py` on the {len(rows)} cases this record has as *looser* (plain check passed, "
             f"the real stack refused); the stack's verdicts are the record's, ktdeploy's are today's (plain check "
             f"on the host in {t_plain} s; `check --stack --model-config` in `{image}` on the model-dependent cases "
             "plain check still passes).", "", "| ktdeploy today | cases |", "|---|---:|"]
    lines += [f"| {v} | {n} |" for v, n in counts.items()]
    lines += ["", "Cases ktdeploy still passes, each with the recorded refusal and whether that refusal was the "
              "oracle's own artefact:", "", "| case | model-dependent | ktdeploy | stack's message (recorded) | artefact of the oracle |",
              "|---|---|---|---|---|"]
    for r in open_rows:
        lines.append(f"| `{r['case_id']}` | {'yes' if r['model_dependent'] else 'no'} | {r['verdict']} | "
                     f"{h._md_escape(r['stack_message'][:110])} | {h._md_escape(r['oracle_artefact'][:160]) or '**no: open**'} |")
    where = record.resolve().relative_to(REPO) if record.resolve().is_relative_to(REPO) else record
    lines += ["", f"Reproduce: `.venv/bin/python bench/oracle_recheck.py {where}` (needs the full image).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
