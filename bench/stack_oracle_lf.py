"""LlamaFactory half of the stack oracle: LlamaFactory-KT's own `get_train_args` vs `ktdeploy check`.

Runs INSIDE the full image (torch, llamafactory-kt 0.9.6.dev0, transformers-kt, accelerate-kt, kt-kernel
installed), no GPU needed for argument parsing, on the same train sections as tools/stack_oracle.py (the
shipped recipes and the generated corpus). For each section: write the rendered train.yaml, read it the way
LlamaFactory does (`llamafactory.extras.arguments.read_args` -> OmegaConf.load), call
`llamafactory.hparams.get_train_args(dict)`, and record accepted / the exception; compare with
`ktdeploy check`'s verdict on the full recipe.

Run (from the repository root, in the full image):

    docker run --rm -v "$PWD":/src -w /src ktsft:amx python bench/stack_oracle_lf.py \
        > bench/results/stack_oracle_lf.txt

Status: NOT RUN — the full image is not built on the development machine (no GPU image build here).
Expected caveats when it is run: get_train_args checks paths (model_name_or_path must exist for the
tokenizer/config, dataset_dir) -> the script points them at a tiny local model made by
`python -m ktdeploy.agent.tiny` when present, and counts path errors separately from rule errors.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

PATH_ERRORS = ("does not exist", "No such file", "not found", "Can't load", "is not a local folder")


def lf_verdict(train_yaml: str) -> tuple[bool, str]:
    from llamafactory.hparams import get_train_args
    from omegaconf import OmegaConf

    args = OmegaConf.to_container(OmegaConf.load(io.StringIO(train_yaml)))
    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
    try:
        get_train_args(args)
        return True, ""
    except SystemExit as err:  # HfArgumentParser exits on unknown keys
        return False, f"SystemExit: {err}"
    except Exception as err:  # noqa: BLE001 - the verdict is the exception itself
        return False, f"{type(err).__name__}: {err}"


def main() -> int:
    import stack_oracle as so

    from ktdeploy.core.recipe.document import build
    from ktdeploy.core.recipe.loader import RawRecipe, Source
    from ktdeploy.core.recipe.render import render
    from ktdeploy.core.recipe.rules import run_rules

    counts = {"agree": 0, "ktdeploy-stricter": 0, "ktdeploy-looser": 0, "path-error (not counted)": 0}
    items = list(so.shipped()) + (list(so.corpus(pairs=False)) if "--corpus" in sys.argv else [])
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for name, doc in items:
            recipe = build(RawRecipe(doc=doc, source=Source(), path=None))
            kd_errors = [f for f in run_rules(recipe) if f.severity == "error"]
            ok, why = lf_verdict(render(recipe).train_yaml)
            if not ok and any(p in why for p in PATH_ERRORS):
                counts["path-error (not counted)"] += 1
                continue
            kind = "agree" if ok == (not kd_errors) else ("ktdeploy-stricter" if ok else "ktdeploy-looser")
            counts[kind] += 1
            if kind != "agree":
                print(f"{kind}: {name}: LF {'accepts' if ok else why[:200]}; "
                      f"ktdeploy {[f.rule + ':' + f.path for f in kd_errors]}")
    print(counts)
    return 1 if counts["ktdeploy-looser"] else 0


if __name__ == "__main__":
    sys.exit(main())
