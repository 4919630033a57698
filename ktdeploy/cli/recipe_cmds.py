"""`ktdeploy check` and `ktdeploy render`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, print_findings, print_json, print_judgement
from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.markup import esc
from ktdeploy.core.recipe import errors, load_native, load_recipe, render, require_valid, validate

SET_HELP = "Override a recipe value: SECTION.KEY=VALUE (VALUE parsed as YAML), repeatable."


def load_from_cli(recipe: Optional[Path], train: Optional[Path] = None, accelerate: Optional[Path] = None,
                  deploy: Optional[Path] = None, overrides: list[str] | None = None):
    """A recipe file, or the two native files (--train and --accelerate, optionally --deploy)."""
    overrides = overrides or []
    if recipe is not None and (train or accelerate):
        raise UsageError("give either a RECIPE or --train/--accelerate, not both", fix="ktdeploy check RECIPE")
    if recipe is not None:
        return load_recipe(recipe, overrides)
    if train and accelerate:
        return load_native(train, accelerate, deploy, overrides)
    if train or accelerate:
        raise UsageError("--train and --accelerate go together", fix="ktdeploy check --train T.yaml --accelerate A.yaml")
    raise UsageError("no recipe given", fix="ktdeploy check recipes/tiny-moe-lora.yaml")


@app.command()
def check(
    recipe: Optional[Path] = typer.Argument(None, help="Recipe YAML (train/accelerate/deploy sections)."),
    train: Optional[Path] = typer.Option(None, "--train", help="Native LlamaFactory training YAML."),
    accelerate: Optional[Path] = typer.Option(None, "--accelerate", help="Native Accelerate YAML."),
    deploy: Optional[Path] = typer.Option(None, "--deploy", help="Optional deploy YAML for the native pair."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print findings as JSON."),
    stack: bool = typer.Option(False, "--stack", help="Also let the stack judge: accelerate's launch parsing and the "
                                                      "KT plugin, LlamaFactory's get_train_args on the rendered "
                                                      "train.yaml, kt-kernel's KTConfig and wrapper checks, run in "
                                                      "the image (no weights, no GPU). Exit 7 when it cannot run."),
    image: Optional[str] = typer.Option(None, "--image", help="With --stack: the image to judge in (default: the "
                                                              "recipe's deploy.image; auto = the first of "
                                                              "ktsft:amx/avx512/avx2 on this machine; inside the "
                                                              "image: its own stack)."),
) -> None:
    """Validate a recipe against every cookbook, LlamaFactory and kt-kernel rule. Exit 0 valid, 2 invalid
    (--stack: 7 when the stack's judgement cannot run)."""
    if image is not None and not stack:
        raise UsageError("--image names the image --stack judges in", key="--image", fix="add --stack")
    judged = None
    try:
        r = load_from_cli(recipe, train, accelerate, deploy, set_)
        findings = validate(r)
        if stack:
            from ktdeploy.controller.stack_judge import check_with_stack
            from ktdeploy.core.recipe.stack_judge import merge

            stack_findings, judged, where = check_with_stack(r, image=image)
            findings = merge(findings, stack_findings)
    except RecipeError as err:
        if not as_json:
            raise
        print_json({"valid": False, "errors": len(err.findings) or 1, "warnings": 0,
                    "findings": [f.to_json() for f in err.findings] or [{"severity": "error", "path": "(document)",
                                                                         "message": err.message, "fix": err.fix or ""}]})
        raise typer.Exit(2) from None
    errs = errors(findings)
    if as_json:
        print_json({"valid": not errs, "errors": len(errs), "warnings": len(findings) - len(errs),
                    "findings": [f.to_json() for f in findings],
                    **({"stack": {"where": where, **judged.to_json()}} if judged is not None else {})})
    else:
        name = str(recipe or train)
        if findings:
            print_findings(findings)
        if judged is not None:
            print_judgement(judged, where)
        if errs:
            console.print(f"[red]✗ {esc(name)}: {esc(len(errs))} error(s), {esc(len(findings) - len(errs))} warning(s)")
        else:
            console.print(f"[green]✓ {esc(name)} is valid[/green]" + (f" ({esc(len(findings))} warning(s))" if findings else ""))
    if errs:
        raise typer.Exit(2)


@app.command("render")
def render_cmd(
    recipe: Optional[Path] = typer.Argument(None, help="Recipe YAML."),
    out_text: str = typer.Option(..., "-o", "--out", help="Directory for train.yaml, accelerate.yaml and launch.sh."),
    train: Optional[Path] = typer.Option(None, "--train", help="Native LlamaFactory training YAML."),
    accelerate: Optional[Path] = typer.Option(None, "--accelerate", help="Native Accelerate YAML."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    force: bool = typer.Option(False, "--force", help="Replace train.yaml/accelerate.yaml/launch.sh if present."),
) -> None:
    """Write the two YAML files and launch.sh (byte-identical for the same input). Refuses an invalid recipe."""
    if not out_text.strip() or "\x00" in out_text:
        raise UsageError(f"-o {out_text!r}: an empty or invalid folder name", fix="give a folder, e.g. -o out/")
    out = Path(out_text)
    r = load_from_cli(recipe, train, accelerate, None, set_)
    warnings = require_valid(r)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory", fix="give a directory for -o")
    files = render(r).write(out, overwrite=force)
    for f in warnings:
        console.print(f"[yellow]warn[/yellow] {esc(f.path)}: {esc(f.message)}")
    for _name, p in files.items():
        console.print(f"wrote {esc(p)}")
