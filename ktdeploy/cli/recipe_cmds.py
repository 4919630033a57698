"""`ktdeploy check` and `ktdeploy render`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.help import App
from ktdeploy.cli.output import console, err_console, print_findings, print_json, print_judgement
from ktdeploy.core import variants as V
from ktdeploy.core.errors import OverwriteRefused, RecipeError, RunRecordError, UsageError
from ktdeploy.core.recipe import Recipe, errors, load_native, load_recipe, render, require_valid, validate
from ktdeploy.core.terminal_text import esc

SET_HELP = "Override a recipe value: SECTION.KEY=VALUE (VALUE parsed as YAML), repeatable."


def load_from_cli(recipe: Optional[Path], train: Optional[Path] = None, accelerate: Optional[Path] = None,
                  deploy: Optional[Path] = None, overrides: list[str] | None = None) -> Recipe:
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
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print findings as JSON."),
    stack: bool = typer.Option(False, "--stack", help="Also let the stack judge: accelerate's launch parsing and the "
                                                      "KT plugin, LlamaFactory's get_train_args on the rendered "
                                                      "train.yaml, kt-kernel's KTConfig and wrapper checks, run in "
                                                      "the image (no weights, no GPU). Exit 7 when it cannot run."),
    image: Optional[str] = typer.Option(None, "--image", help="With --stack: the image to judge in (default: the "
                                                              "recipe's deploy.image; auto = the first "
                                                              "ktsft:<build> on this machine; inside the "
                                                              "image: its own stack)."),
    model_config: Optional[Path] = typer.Option(None, "--model-config", metavar="PATH",
                                                help="With --stack: the model's config.json (or its directory) the "
                                                     "judge builds the model skeleton from (LoRA targets, kt-kernel's "
                                                     "model checks; no weights). Default: <model_name_or_path>/"
                                                     "config.json, then recipes/models/<name>.json."),
) -> None:
    """Validate a recipe against every cookbook, LlamaFactory and kt-kernel rule. Exit 0 valid, 2 invalid
    (--stack: 7 when the stack's judgement cannot run)."""
    if image is not None and not stack:
        raise UsageError("--image names the image --stack judges in", key="--image", fix="add --stack")
    if model_config is not None and not stack:
        raise UsageError("--model-config is the config the --stack judge builds the model skeleton from",
                         key="--model-config", fix="add --stack")
    judged = None
    try:
        r = load_from_cli(recipe, train, accelerate, deploy, set_)
        findings = validate(r)
        if stack:
            from ktdeploy.controller.stack_judge_runner import check_with_stack
            from ktdeploy.core.recipe.stack_judge_payload import merge

            stack_findings, judged, where = check_with_stack(r, image=image, model_config=model_config)
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
    out_text: Optional[str] = typer.Option(None, "-o", "--out", metavar="DIR", help="Directory for train.yaml, accelerate.yaml and "
                                                                     "launch.sh (with --slurm / --k8s: their files; "
                                                                     "without -o they go to stdout)."),
    train: Optional[Path] = typer.Option(None, "--train", help="Native LlamaFactory training YAML."),
    accelerate: Optional[Path] = typer.Option(None, "--accelerate", help="Native Accelerate YAML."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    force: bool = typer.Option(False, "--force", help="Replace files already present in -o."),
    slurm: bool = typer.Option(False, "--slurm", help="The sbatch scripts (training, then conversion)."),
    k8s: bool = typer.Option(False, "--k8s", help="Kubernetes ConfigMap, Job (training), Deployment + Service "
                                                  "(serving)."),
    variant: Optional[str] = typer.Option(None, "--variant", help=f"The kt-kernel build the nodes' image pins ({', '.join(V.NAMES)}): needed with "
                                                                  "deploy.image: auto."),
    namespace: str = typer.Option("default", "--namespace", help="Kubernetes namespace (--k8s)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="--slurm: how the job starts the image (podman, "
                                                                  "pyxis, apptainer, docker; default: the recipe's "
                                                                  "deploy.scheduler.runtime, podman for auto)."),
) -> None:
    """Write the two YAML files and launch.sh (byte-identical for the same input); or, with --slurm / --k8s, the
    batch scripts / manifests. Refuses an invalid recipe."""
    if out_text is not None and (not out_text.strip() or "\x00" in out_text):
        raise UsageError(f"-o {out_text!r}: an empty or invalid folder name", fix="give a folder, e.g. -o out/")
    if slurm and k8s:
        raise UsageError("--slurm and --k8s: one at a time", fix="ktdeploy render --slurm RECIPE")
    if out_text is None and not (slurm or k8s):
        raise UsageError("-o DIR is needed (train.yaml, accelerate.yaml, launch.sh)", key="-o",
                         fix="ktdeploy render RECIPE -o out/")
    out = Path(out_text) if out_text is not None else None
    r = load_from_cli(recipe, train, accelerate, None, set_)
    warnings = require_valid(r)
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory", fix="give a directory for -o")
    for f in warnings:   # to stderr when the scripts/manifests go to stdout
        (err_console if slurm or k8s else console).print(f"[yellow]warn[/yellow] {esc(f.path)}: {esc(f.message)}")
    if slurm or k8s:
        _render_scheduler(r, out, slurm=slurm, variant=variant, namespace=namespace, force=force, runtime=runtime)
        return
    assert out is not None
    files = render(r).write(out, overwrite=force)
    for _name, p in files.items():
        console.print(f"wrote {esc(p)}")


def _render_scheduler(r: Recipe, out: Optional[Path], *, slurm: bool, variant: Optional[str], namespace: str,
                      force: bool, runtime: Optional[str] = None) -> None:
    from ktdeploy.core.safeio import write_file
    from ktdeploy.core.sched.job_files import k8s_manifests, slurm_scripts
    from ktdeploy.core.sched.k8s import render_yaml

    if slurm:
        files = {f"{j.role}.sbatch": j.script for j in slurm_scripts(r, variant, runtime=runtime)}
    else:
        docs = k8s_manifests(r, variant, namespace)
        files = {"train-job.yaml": render_yaml(docs[:2]), "serve.yaml": render_yaml([docs[0], *docs[2:]])}
    if out is None:
        import sys

        text = files["train.sbatch"] if slurm else render_yaml(k8s_manifests(r, variant, namespace))
        if sys.stdout.isatty():   # on a terminal, a recipe value's bidi override or escape is shown, never acted on
            from ktdeploy.core.terminal_text import terminal_safe

            text = terminal_safe(text)
        sys.stdout.write(text)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        console.print(f"wrote {esc(write_file(out, name, text, overwrite=force))}")
recipe_app = App(help="Make a recipe from what you already have.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")


@recipe_app.command("from-lf")
def from_lf(
    train: Path = typer.Argument(..., metavar="TRAIN", help="LlamaFactory's training YAML."),
    accelerate: Optional[Path] = typer.Argument(None, metavar="ACCELERATE", show_default=False,
                                                help="Accelerate's YAML (default: the cookbook's FSDP2, 1 GPU)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", metavar="FILE",
                                       help="Recipe to write (default: TRAIN's name + -recipe.yaml, here)."),
    force: bool = typer.Option(False, "--force", help="Replace the recipe file if it exists (atomically)."),
) -> None:
    """Write a recipe from a LlamaFactory training YAML (and Accelerate YAML); never over a file without --force.

    deploy: is derived from the paths the training YAML names (core/recipe/from_lf.py); the recipe is checked
    at once: exit 0 when it is valid, 2 when `ktdeploy check` finds errors (the file is written either way, to
    fix)."""
    from ktdeploy.core.recipe.from_lf import recipe_document, unresolved
    from ktdeploy.core.recipe.loader import read_native
    from ktdeploy.core.recipe.render import dump_yaml
    from ktdeploy.core.recipe.secret_scan import secret_findings
    from ktdeploy.core.safeio import printable, write_file

    for flag, p in (("TRAIN", train), ("ACCELERATE", accelerate)):
        if p is not None and not p.is_file():
            raise UsageError(f"{flag} {printable(str(p))}: no such file", key=flag, fix="Give the YAML file's path.")
    raw = read_native(train, accelerate)
    t = raw.doc.get("train")
    if not isinstance(t, dict) or not t:
        raise UsageError(f"{printable(str(train))} is not a training YAML (a mapping of LlamaFactory keys)",
                         key="TRAIN", fix="Give the YAML you pass to `llamafactory-cli train`.")
    if {"train", "accelerate", "deploy"} & set(t):
        raise UsageError(f"{printable(str(train))} is a ktdeploy recipe already (it has train:/accelerate:/deploy:)",
                         key="TRAIN", fix=f"ktdeploy check {train}")
    doc = recipe_document(t, raw.doc.get("accelerate") if accelerate is not None else None)
    target = out or Path(f"{train.stem}-recipe.yaml")
    header = (f"# written by `ktdeploy recipe from-lf` from {printable(train.name)}"
              + (f" and {printable(accelerate.name)}" if accelerate is not None else
                 " (accelerate: the cookbook's FSDP2 block, 1 process)")
              + "\n# deploy: derived from the training YAML's paths; check the volumes and gpus\n")
    text = header + dump_yaml(doc)
    secrets = secret_findings(text)
    if secrets:   # refused before the file exists: a secret is never written, even to be fixed
        raise RecipeError(f"{printable(str(train))} holds {len(secrets)} secret(s) ktdeploy never writes into a "
                          f"recipe; nothing was written", findings=secrets, key="TRAIN",
                          fix="Remove them from the training YAML (a token in the environment or a credential "
                              "file instead), then run `ktdeploy recipe from-lf` again.")
    try:   # the safe writer: a new file renamed into place, so an interrupted write never leaves half a recipe
        written = write_file(target.parent, target.name, text, overwrite=force)
    except RunRecordError:   # the file exists (or is a link): never overwritten without --force
        again = shlex.join(["ktdeploy", "recipe", "from-lf", str(train), *([str(accelerate)] if accelerate else []),
                            *(["-o", str(out)] if out else []), "--force"])
        raise OverwriteRefused(f"{target.resolve()} exists; not overwritten", key="--out",
                               fix=f"Replace it: {again}; or write another file with -o FILE.") from None
    console.print(f"wrote {esc(written)}", highlight=False)
    for key in unresolved(t):
        console.print(f"[yellow]note:[/yellow] train.{esc(key)} is not an absolute host path: deploy.volumes keeps "
                      "its default there; set both to your host's folders", highlight=False)
    findings = validate(load_recipe(written))
    errs = errors(findings)
    if findings:
        print_findings(findings)
    if errs:
        console.print(f"[red]✗ {esc(written)}: {len(errs)} error(s) for `ktdeploy check`; fix them in the file, "
                      f"then: ktdeploy check {esc(shlex.quote(str(written)))}[/red]", highlight=False)
        raise typer.Exit(2)
    q = esc(shlex.quote(str(written)))
    console.print(f"[green]✓ {esc(written)} is valid[/green]. Next: ktdeploy plan {q} (memory and time), then "
                  f"ktdeploy up {q} (this machine; --host for another)", highlight=False)
