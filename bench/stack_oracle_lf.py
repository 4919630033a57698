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

Status: run on 2026-12-04 in ktsft:amx (CPU only): shipped 6 agree; corpus 135 agree, 99 ktdeploy-stricter
(kt-kernel's own rules, which get_train_args does not check), 0 looser; results in bench/results/ and
docs/stack-rules.md. Model paths are not opened by get_train_args, so no path error occurred.
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


def pretend_bf16_gpu() -> None:
    """This oracle compares recipe rules, not hardware: on a CPU-only box transformers' TrainingArguments
    refuses every bf16 recipe ("Your setup doesn't support bf16/gpu"), and LlamaFactory's pure_bf16 check
    does the same, before any rule is read. Both hardware gates are told a bf16 GPU is present (the recipes
    target one); every other check runs unchanged."""
    import llamafactory.hparams.parser as lf_parser
    import transformers.training_args as ta

    ta.is_torch_bf16_gpu_available = lambda: True
    lf_parser.is_torch_bf16_gpu_available = lambda: True


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

    pretend_bf16_gpu()
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
