"""The agent's commands - what the image's entrypoint runs on the training host:
`ktdeploy train`, `ktdeploy convert`, `ktdeploy merge`, `ktdeploy serve`, `ktdeploy tiny-model`,
`ktdeploy prepare-weights`."""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.help import IN_IMAGE
from ktdeploy.cli.in_image import in_image_fix, require_module
from ktdeploy.cli.output import console, err_console, print_json
from ktdeploy.cli.recipe_cmds import SET_HELP
from ktdeploy.core.errors import UsageError
from ktdeploy.core.terminal_text import esc


@app.command(rich_help_panel=IN_IMAGE)
def train(
    recipe: Optional[Path] = typer.Argument(None, metavar="RECIPE", show_default=False,
                                            help="Recipe YAML (or --train/--accelerate)."),
    native_train: Optional[Path] = typer.Option(None, "--train", metavar="FILE",
                                                help="LlamaFactory's training YAML, instead of a RECIPE."),
    native_accelerate: Optional[Path] = typer.Option(None, "--accelerate", metavar="FILE",
                                                     help="Accelerate's YAML, with --train."),
    native_deploy: Optional[Path] = typer.Option(None, "--deploy", metavar="FILE",
                                                 help="ktdeploy's deploy: YAML for the pair (default: derived)."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    waive: list[str] = typer.Option([], "--waive", metavar="CHECK",
                                    help="Let this failing doctor check pass, on the record (repeatable)."),
    cpu_only: bool = typer.Option(False, "--cpu-only", help="Test profile for a host without a GPU: waive the GPU "
                                                            "checks."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate, doctor and render; print what would run."),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="auto|DIR", help="'auto' (last checkpoint-* of output_dir) or a "
                                                                "checkpoint-N path."),
    skip_doctor: bool = typer.Option(False, "--skip-doctor", help="Do not run the host checks (nor the stack's judgement of the rendered files) first (not recommended); kt threads are still derived from this host's topology."),
    run_root: Optional[str] = typer.Option(None, "--run-root", metavar="DIR", help="Where run records go (default: "
                                                                     "<output_dir's parent>/.ktdeploy-runs/<name>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan (dry run) or the summary as JSON."),
    tuned: Optional[Path] = typer.Option(None, "--tuned", help="Apply the settings chosen by `ktdeploy tune` "
                                                                "(its tune.json) to the rendered training YAML."),
    exec_launch: bool = typer.Option(True, "--exec/--watch", help="--exec (default): become the launcher, so no "
                                     "ktdeploy process runs beside the trainer (a watching parent cost ~8 % "
                                     "tokens/s on the GPU machine); the trainer writes the record's summary. "
                                     "--watch: stay as a parent that samples the process tree's RSS and keeps "
                                     "stdout.log in the record."),
) -> None:
    """Fine-tune on this host: validate -> doctor -> render -> the stack judges the rendered files -> accelerate
    launch LlamaFactory with KT."""
    from ktdeploy.agent.train import ThisHost, execute, plan_train

    choice = None
    if tuned is not None:
        from ktdeploy.agent.tune.session import tuned_choice, tuned_overrides

        choice = tuned_choice(tuned)
        set_ = list(set_) + tuned_overrides(tuned)

    from ktdeploy.cli.up_cmds import native_pair
    from ktdeploy.controller.local_host import local_doctor, local_facts
    from ktdeploy.controller.stack_judge_runner import judge_rendered
    from ktdeploy.core.checks.gate import with_profile

    pair = native_pair(recipe, native_train, native_accelerate, native_deploy)
    loaded = None
    if pair is not None:
        from ktdeploy.controller.up_inputs import load_up_recipe

        loaded = load_up_recipe(None, set_, pair)
    elif recipe is None:
        raise UsageError("no recipe given", key="RECIPE", fix="ktdeploy train RECIPE, or --train T.yaml --accelerate A.yaml")
    plan = plan_train(str(recipe or native_train), set_, resume=resume, skip_doctor=skip_doctor, run_root=run_root,
                      tuned=choice, host=ThisHost(diagnose=local_doctor, topology=lambda: local_facts(probes=False)),
                      waive=with_profile(waive, cpu_only), recipe=loaded, judge=judge_rendered)
    for w in plan.warnings:
        err_console.print(f"[yellow]warning:[/] {esc(w)}")
    if plan.derived:
        err_console.print("derived from this host: " + ", ".join(f"{esc(k)}={esc(v)}" for k, v in plan.derived.items()))
    if dry_run:
        if as_json:
            print_json(plan.to_json())
            return
        console.rule("train.yaml")
        console.print(plan.train_yaml, markup=False, highlight=False)
        console.rule("accelerate.yaml")
        console.print(plan.accelerate_yaml, markup=False, highlight=False)
        console.rule("command")
        env = " ".join(f"{k}={v}" for k, v in {**plan.env_defaults, **plan.env}.items())
        console.print(f"{env} {' '.join(plan.argv)}", markup=False, highlight=False)
        console.print(f"run record: {plan.run_dir}", markup=False, highlight=False)
        return
    summary = execute(plan, exec_launch=exec_launch)
    if as_json:
        print_json({"run_dir": plan.run_dir, **summary})
    else:
        err_console.print(f"[green]training finished[/]: {esc(plan.output_dir)}  (record: {esc(plan.run_dir)})")
        if summary.get("loss_first") is not None:
            err_console.print(f"loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}, "
                              f"peak host RSS {summary['peak_host_rss_gib']:.2f} GiB")


@app.command(rich_help_panel=IN_IMAGE)
def convert(
    output_dir: Path = typer.Argument(..., help="Training output_dir (or one checkpoint-* in it)."),
    out: str = typer.Option(..., "-o", "--out", metavar="DIR", help="New adapter directory for sglang-kt --lora-paths."),
    base_model: Optional[str] = typer.Option(None, "--base-model", metavar="MODEL_DIR", help="Base model path to record (default: "
                                                                         "the one the adapter names)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the manifest's size/SHA-256 check."),
    as_json: bool = typer.Option(False, "--json", help="Print the conversion summary as JSON."),
) -> None:
    """Convert a raw KT output into what sglang-kt serves (an adapter, or a full fine-tune's model).

    A LoRA run gives one adapter (PEFT part + fused expert LoRA); a full fine-tune a model directory (HF weights +
    the KT Full experts regrouped per expert)."""
    from ktdeploy.agent.convert import FullConvertSummary
    from ktdeploy.agent.convert import convert as do_convert

    s = do_convert(output_dir, out, base_model=base_model, verify_manifest=not no_verify)
    if as_json:
        print_json(asdict(s))
        return
    if isinstance(s, FullConvertSummary):
        console.print(f"[green]model written[/]: {esc(s.output_dir)}")
        console.print(f"{esc(s.expert_tensors)} expert tensors ({esc(s.num_layers)} layers x {esc(s.num_experts)} experts) regrouped; "
                      f"{len(s.linked_files)} HF files linked", highlight=False)
        return
    console.print(f"[green]adapter written[/]: {esc(s.output_dir)}")
    console.print(f"rank {esc(s.rank)}, alpha {s.lora_alpha:g}; {esc(s.nonexpert_tensors)} non-expert + {esc(s.expert_tensors)} "
                  f"expert tensors ({s.num_layers} layers x {s.num_experts} experts); "
                  f"targets: {esc(', '.join(s.target_modules))}", highlight=False)


@app.command(rich_help_panel=IN_IMAGE)
def merge(
    output_dir: Path = typer.Argument(..., help="KT LoRA training output_dir (or one checkpoint-* in it)."),
    base: Path = typer.Option(..., "--base", metavar="MODEL_DIR", help="The base model folder the adapter was trained on (safetensors: "
                                                  "BF16, F16, F32, or FP8 with block scales, written as BF16)."),
    out: str = typer.Option(..., "-o", "--out", metavar="MERGED_DIR",
                            help="New folder for the merged model (absent or empty)."),
    base_root: Optional[Path] = typer.Option(None, "--base-root", metavar="DIR", help="The volume links inside the base folder may "
                                                                       "point into (default: the base folder)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, max=256, help="Worker threads (default: up to 4)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the KT manifest's size/SHA-256 check."),
    as_json: bool = typer.Option(False, "--json", help="Print the merge summary as JSON."),
) -> None:
    """Fold the KT LoRA into the base weights: a plain Hugging Face model any engine serves.

    Both parts (routed experts + attention/router/shared) are merged; ktdeploy_merge.json records the SHA-256 of
    every input and output file. Streams shard by shard in bounded memory; a killed merge resumes; numpy only."""
    # The merge runs its own worker threads; a BLAS pool per thread would oversubscribe the cores (set before numpy).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    try:
        from ktdeploy.agent.merge import merge as do_merge
    except ImportError as err:   # a controller installed without the [merge] extra
        raise UsageError(f"merge needs numpy, which this install lacks ({err})",
                         fix="pip install 'ktdeploy[merge]' (numpy only), or " + in_image_fix(
                             "merge", output_dir, base, Path(out).parent,
                             args=shlex.join([str(output_dir), "--base", str(base), "-o", out]))) from None

    from ktdeploy.cli.progress import Ticker

    with Ticker("merge: shards", err_console, plain_ticks=False, quiet=as_json) as ticker:   # a bar on a terminal
        s = do_merge(output_dir, base, out, base_root=base_root, verify_manifest=not no_verify, workers=threads,
                     say=None if as_json else ticker)
    if as_json:
        print_json(asdict(s))
        return
    console.print(f"[green]merged model written[/]: {esc(s.output_dir)}")
    console.print(f"rank {s.rank}, alpha {s.lora_alpha:g} (scale {s.scale:g}); {s.expert_tensors} expert tensors "
                  f"({s.expert_layers} layers x {s.num_experts} experts, {esc(s.layout)}) + {s.nonexpert_tensors} other "
                  f"tensors merged; {s.shards} shard(s), {s.kept_shards} kept from an interrupted run; "
                  f"{s.bytes_out / 1e9:.2f} GB in {s.seconds:.1f} s", highlight=False)
    for note in s.notes:
        console.print(f"note: {esc(note)}", highlight=False)


@app.command("prepare-weights", rich_help_panel=IN_IMAGE)
def prepare_weights(
    model: Optional[Path] = typer.Argument(None, metavar="MODEL_DIR", show_default=False,
                                           help="The BF16 or block-FP8 model folder (or --recipe)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="int8 | amxint4 (default: the recipe's)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", metavar="DIR",
                                       help="New folder for the converted experts (default: the recipe's "
                                            "kt_weight_path)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", metavar="FILE",
                                          help="Take the model, format, thread pools and output from this recipe."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    threadpools: Optional[int] = typer.Option(None, "--threadpools", min=1, max=64,
                                              help="kt_threadpool_count the training will use (the layout splits "
                                                   "each expert across the pools; default: the recipe's, else 1)."),
    ephemeral: Optional[str] = typer.Option(None, "--ephemeral", metavar="RUN_ID",
                                            help="INT8 only: stage in /dev/shm/kt-int8-RUN_ID for one run "
                                                 "(kt-kernel's ephemeral lifecycle) instead of -o."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, max=1024,
                                          help="CPU threads for kt-kernel's quantizer (default: this host's "
                                               "kt_num_threads)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the forward check against BF16 and "
                                                              "kt-kernel's validation of the result."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Convert a model's routed experts for INT8 or AMXINT4 training with kt-kernel's own quantizer.

    One layer at a time; built beside -o and published by one rename; an interrupted run resumes. The result
    passes kt-kernel's own validation (INT8) and a forward check against BF16 before it is published."""
    from ktdeploy.agent.prepare_weights import prepare
    from ktdeploy.core import kt_weights as kw

    if recipe is not None:
        from ktdeploy.core.recipe.document import load_recipe

        r = load_recipe(recipe, set_)
        need = kw.needed_by(r.weight_setup(), r.keys.kt_config, r.keys.model_name_or_path, r.keys.kt_weight_path)
        if need is None:
            raise UsageError(f"{recipe} trains {r.weight_setup().upper()} experts, which need no conversion",
                             key="--recipe", fix="prepare-weights is for INT8 and AMXINT4 recipes (kt_weight_path)")
        model = model or Path(need.model)
        fmt = fmt or need.format
        threadpools = threadpools or need.pools
        if need.ephemeral_run_id is not None:
            ephemeral = ephemeral or need.ephemeral_run_id
        else:
            out = out or Path(need.output or "")
    if model is None or fmt is None:
        raise UsageError("no model or format given", key="MODEL_DIR",
                         fix="ktdeploy prepare-weights MODEL_DIR --format int8 -o DIR, or --recipe RECIPE")
    if threads is None:
        from ktdeploy.controller.local_host import local_threads

        threads = local_threads(2)[0]
    from ktdeploy.agent.prepare_weights import stdout_to_stderr
    from ktdeploy.cli.progress import Ticker

    with stdout_to_stderr(), Ticker(f"prepare-weights {fmt}: layers", err_console, plain_ticks=False,
                                    quiet=as_json) as ticker:   # a bar on a terminal, else the lines
        s = prepare(model, out, fmt, pools=threadpools or 1, threads=threads, verify=not no_verify,
                    ephemeral_run_id=ephemeral, say=(lambda m: None) if as_json else ticker)
    if as_json:
        print_json(s.to_json())
        return
    done = "already prepared" if s.verify.get("already_prepared") else "written"
    console.print(f"[green]{esc(s.format.upper())} experts {done}[/]: {esc(s.output_dir)}")
    console.print(f"{s.layers} layers x {s.experts} experts, {s.pools} thread pool(s): {s.files} files, "
                  f"{s.bytes / 2**30:.2f} GiB in {s.seconds:.1f} s ({s.kept_layers} kept from an interrupted run)",
                  highlight=False)
    fwd = s.verify.get("forward")
    if fwd and fwd.get("skipped"):
        console.print(f"[yellow]forward check skipped[/]: {esc(fwd['skipped'])}", highlight=False)
    elif fwd:
        console.print(f"forward check (layer {fwd['layer']}, {fwd['tokens']} tokens, {esc(fwd['loader'])}): relative "
                      f"L2 {fwd['rel_l2']:.4f} against BF16 (tolerance {fwd['tolerance']})", highlight=False)
    if "kt_kernel" in s.verify:
        console.print(f"kt-kernel validation: {esc(s.verify['kt_kernel']['validator'])} passed "
                      f"({s.verify['kt_kernel']['files']} files hashed)", highlight=False)


@app.command(rich_help_panel=IN_IMAGE)
def serve(
    recipe: Path = typer.Argument(..., help="Recipe YAML (model, KT settings, deploy.serve)."),
    adapter: Optional[Path] = typer.Option(None, "--adapter", metavar="DIR", help="Adapter directory written by `ktdeploy convert` "
                                                                   "(LoRA run)."),
    weights: Optional[Path] = typer.Option(None, "--weights", metavar="DIR", help="A full fine-tune's output_dir: serve the trained "
                                                                   "weights themselves (no adapter, no LoRA)."),
    merged: Optional[Path] = typer.Option(None, "--merged", metavar="MERGED_DIR", help="A model written by `ktdeploy merge`: served as a "
                                                                 "plain BF16 model (--kt-method BF16, no LoRA)."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    cpuinfer: Optional[int] = typer.Option(None, "--kt-cpuinfer", help="CPU expert threads (default: derived "
                                                                         "from this host's physical cores)."),
    threadpools: Optional[int] = typer.Option(None, "--kt-threadpool-count", help="Default: NUMA nodes."),
    print_only: bool = typer.Option(False, "--print", help="Print the command instead of starting the server."),
    as_json: bool = typer.Option(False, "--json", help="With --print: the argv as JSON."),
    waive: list[str] = typer.Option([], "--waive", metavar="CHECK", help="Start even though this check fails "
                                                                         "(gpu.present: a test double of sglang)."),
) -> None:
    """Serve the base model with the converted KT adapter (or a full fine-tune's weights, or a merged model) through
    sglang-kt."""
    from ktdeploy.agent.serve import build_serve_command
    from ktdeploy.core.recipe import load_recipe, require_valid

    r = load_recipe(recipe, set_)
    require_valid(r)
    if sum(x is not None for x in (adapter, weights, merged)) != 1:
        raise UsageError("give exactly one of --adapter ADAPTER_DIR (LoRA run), --weights OUTPUT_DIR (full fine-tune) "
                         "and --merged MERGED_DIR (`ktdeploy merge`)",
                         fix="`ktdeploy up` passes the right one; by hand: --adapter <output_dir>-sglang")
    if merged is not None and not (merged / "ktdeploy_merge.json").is_file():
        raise UsageError(f"{merged} is not a merged model (no ktdeploy_merge.json)", key="--merged",
                         fix="run `ktdeploy merge OUTPUT_DIR --base MODEL_DIR -o MERGED_DIR` first")
    if weights is not None and not (weights / "config.json").is_file():
        raise UsageError(f"{weights} holds no trained model (no config.json)", key="--weights",
                         fix="point at the output_dir of a finished full fine-tune (finetuning_type: full)")
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise UsageError(f"{adapter} is not a converted adapter (no adapter_config.json)",
                         fix="run `ktdeploy convert OUTPUT_DIR -o ADAPTER_DIR` first")
    from ktdeploy.controller.local_host import local_threads
    from ktdeploy.core.served import Served

    if not print_only:   # before anything slow: a server needs sglang-kt (the image) and a GPU
        flag, served = next((f, d) for f, d in (("--adapter", adapter), ("--weights", weights), ("--merged", merged))
                            if d is not None)
        require_module("sglang", "serve", "sglang-kt", recipe.resolve(), served.resolve(),
                       args=shlex.join([str(recipe.resolve()), flag, str(served.resolve()),
                                        *(x for s in set_ for x in ("--set", s))]))
        _require_gpu(waive)
    cmd = build_serve_command(r, Served.one_of(adapter, weights, merged), cpuinfer=cpuinfer, threadpools=threadpools,
                              host_threads=local_threads, kt_build=os.environ.get("KT_KERNEL_CPU_VARIANT") or None)
    if print_only:
        if as_json:
            print_json({"argv": cmd.redacted, "env": cmd.env})
        else:
            console.print(" ".join(f"{k}={v}" for k, v in cmd.env.items()) + " " + cmd.shell(), markup=False,
                          highlight=False)
        return
    env = {**os.environ, **cmd.env}
    err_console.print(f"starting: {cmd.shell()}", markup=False, highlight=False)
    os.execvpe(cmd.argv[0], cmd.argv, env)


def _require_gpu(waive: list[str]) -> None:
    """sglang-kt runs attention on a GPU: without one it would load for minutes, then fail deep in CUDA. doctor's own
    gpu.present check on this host (or container), in seconds, before the server starts (exit 1)."""
    from ktdeploy.controller.local_host import local_facts
    from ktdeploy.core.checks.resources import gpu_present_check
    from ktdeploy.core.errors import CheckFailed

    result = gpu_present_check(local_facts(probes=False))
    if result.status != "pass" and str(result.name) in waive:
        err_console.print(f"[yellow]waived {esc(result.name)}[/]: {esc(result.detail)}", highlight=False)
    elif result.status != "pass":
        raise CheckFailed(f"serve needs an NVIDIA GPU (sglang-kt runs attention and the LoRA on it): {result.detail}; "
                          "nothing was started", results=[result], key=str(result.name),
                          fix=f"{result.fix} `ktdeploy serve --print` shows the command without starting it.")


@app.command("tiny-model", rich_help_panel=IN_IMAGE)
def tiny_model(
    model_dir: Path = typer.Argument(..., help="Directory for the model (config, weights, tokenizer)."),
    data_dir: Path = typer.Option(..., "--data-dir", metavar="DIR", help="Directory for the dataset and dataset_info.json."),
    size: str = typer.Option("small", "--size", help="small | medium | large"),
    samples: int = typer.Option(400, "--samples", help="Synthetic training samples."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the weights and the samples."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the dataset files if the folder has them."),
    fmt: str = typer.Option("bf16", "--format", help="bf16 | fp8 (a native block-FP8 checkpoint: float8_e4m3fn "
                                                     "weights, 128x128 weight_scale_inv blocks)."),
) -> None:
    """Build a tiny random Qwen3-MoE, a byte-level BPE tokenizer and a synthetic SFT dataset (needs torch)."""
    from ktdeploy.agent.tiny import build_all
    from ktdeploy.cli.progress import waiting

    try:   # torch loads first: seconds with nothing said, before
        with waiting(err_console, f"tiny-model: building a random Qwen3-MoE in {model_dir} and its data in {data_dir}"):
            res = build_all(model_dir, data_dir, size=size, num_samples=samples, seed=seed, overwrite=overwrite,
                            fmt=fmt)
    except ImportError as err:  # a controller without the ML stack
        raise UsageError(f"tiny-model needs torch, transformers and tokenizers: {err}",
                         fix=in_image_fix("tiny-model", model_dir.parent, data_dir,
                                          args=shlex.join([str(model_dir.resolve()), "--data-dir", str(data_dir.resolve())]))) from None
    print_json(asdict(res))
