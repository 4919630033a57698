"""`ktdeploy check --stack` with the model's config.json, on many recipes, in ONE process inside the full image.

    docker run --rm --user 0 --network none -v "$PWD":/src -w /src -e PYTHONPATH=/src --entrypoint python3 \
        ktsft:amx -m tests.oracle.stack_check_batch CASES_DIR OUT.json [CASE_ID,...]

CASES_DIR/manifest.json is the harness's (each case: recipe.yaml and the config.json stand-in its model resolves
to). Each case runs ktdeploy's own CLI in-process (typer's CliRunner, so the command line is exactly a user's):
``check --stack --json --model-config CONFIG RECIPE``; inside the image ``--stack`` judges in this Python. The
verdict is the exit code (0 valid, 2 invalid, anything else: the check could not run). When the CLI has no
``--model-config`` option for check (branch judge not merged), the cases run without it (today's ``check --stack``,
the model unknown to it) and OUT.json says so (``option_present``: false).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

OPTION = "--model-config"


def main(argv: list[str]) -> int:
    cases_dir, out = Path(argv[1]), Path(argv[2])
    only = set(argv[3].split(",")) if len(argv) > 3 and argv[3] else None
    os.environ["DISABLE_VERSION_CHECK"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from typer.testing import CliRunner

    from ktdeploy.cli import app

    runner = CliRunner()
    t0 = time.monotonic()
    helptext = runner.invoke(app, ["check", "--help"], terminal_width=200).output
    manifest = json.loads((cases_dir / "manifest.json").read_text())
    doc: dict = {"option": OPTION, "option_present": OPTION in helptext, "results": []}
    for entry in manifest["cases"]:
        if only is not None and entry["case_id"] not in only:
            continue
        recipe = cases_dir / entry["case_id"] / "recipe.yaml"
        argv_ = ["check", "--stack", "--json"]
        if entry.get("model_config") and doc["option_present"]:
            argv_ += [OPTION, entry["model_config"]]
        t1 = time.monotonic()
        res = runner.invoke(app, [*argv_, str(recipe)], terminal_width=200)
        try:
            body = json.loads(res.stdout)
        except (ValueError, TypeError):
            body = {}
        errs = [f for f in body.get("findings", []) if f.get("severity") == "error"]
        doc["results"].append({
            "case_id": entry["case_id"], "exit": res.exit_code, "valid": res.exit_code == 0,
            "errors": [{"path": f.get("path"), "message": str(f.get("message", ""))[:300]} for f in errs[:3]],
            "output": "" if body else (res.output or repr(res.exception))[-400:],
            "seconds": round(time.monotonic() - t1, 3)})
    doc["total_seconds"] = round(time.monotonic() - t0, 2)
    out.write_text(json.dumps(doc, indent=0) + "\n")
    print(f"check --stack: {len(doc['results'])} cases in {doc['total_seconds']} s -> {out}", file=sys.__stdout__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
