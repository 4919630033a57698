"""``ktdeploy serve``: the sglang-kt command that serves the base model plus the converted KT adapter.

The argv is built from the recipe (model, weight setup -> --kt-method through core/kt_methods.py, serve section)
and host facts (physical cores / NUMA nodes for the CPU expert pool); it is an argv
list, never a shell string, and binds 127.0.0.1 unless the recipe says otherwise. The API key is
read from the environment variable the recipe names, so it never lands in a recipe or a log.

A live server needs a GPU host with the full image (torch 2.9.1, CUDA 12: sglang-kt's kernels are
built for it). ``tests/integration/test_serve_args_image.py`` parses this argv with sglang-kt's
own ``ServerArgs`` parser inside that image.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ktdeploy.agent.sglang_launch import KEY_ENV_VAR, cache_root
from ktdeploy.core import kt_methods
from ktdeploy.core import variants as V
from ktdeploy.core.checks.threads import serve_threads
from ktdeploy.core.errors import UsageError
from ktdeploy.core.kt_weights import EPHEMERAL_ROOT
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.served import Served

LAUNCHER = "ktdeploy.agent.sglang_launch"


@dataclass
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)   # names only for secrets: values come from os.environ
    redacted: list[str] = field(default_factory=list)   # argv with the API key masked, for printing

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.redacted or self.argv)


def cache_env(environ: Mapping[str, str] | None = None, uid: int | None = None) -> dict[str, str]:
    """Where sglang-kt and torch keep their caches, so nothing asks the user database who we are.

    sglang-kt splits a composite KT adapter into `$SGLANG_KT_LORA_CACHE_DIR`, else into
    `<tmp>/sglang_kt_lora_cache_{getpass.getuser()}` (srt/server_args.py); torch's inductor cache defaults to
    `<tmp>/torchinductor_{getpass.getuser()}`. getpass.getuser() raises for a uid absent from passwd, which is
    what `docker run --user UID:GID` of an SSH user gives. HOME is kept when it is a writable directory (up sets
    HOME=/tmp for a non-root user), else /tmp. The directories are per uid, created 0700 by the launcher."""
    env = dict(os.environ if environ is None else environ)
    uid = os.getuid() if uid is None else uid
    home = env.get("HOME") or ""
    if not home.startswith("/") or home == "/" or not os.access(home, os.W_OK):
        home = "/tmp"
    base = cache_root(home, uid)
    out = {"HOME": home, "SGLANG_KT_LORA_CACHE_DIR": f"{base}/sglang-kt-lora",
           "TORCHINDUCTOR_CACHE_DIR": f"{base}/torchinductor"}
    for key in ("SGLANG_KT_LORA_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        if env.get(key):
            out[key] = env[key]   # the operator's own choice wins
    return out


# A merged model (`ktdeploy merge`) is BF16 whatever the training format was, and served without a LoRA: the one
# table's full-model BF16 row (kt-kernel's inference mode takes BF16, not AMXBF16; docs/serving-merged.md).
MERGED_SETUP = "bf16"


def _no_topology(_reserve_cores: int) -> tuple[int, int]:
    raise UsageError("no thread count: neither --kt-cpuinfer/--kt-threadpool-count nor the recipe's kt_config sets it, "
                     "and no host topology was given", fix="set kt_num_threads and kt_threadpool_count in the recipe")


def build_serve_command(recipe: Recipe, served: Served, *, cpuinfer: int | None = None,
                        threadpools: int | None = None,
                        host_threads: Callable[[int], tuple[int, int]] = _no_topology,
                        python: str = "python3", environ: Mapping[str, str] | None = None, kt_build: str | None = None,
                        uid: int | None = None) -> ServeCommand:
    """argv of sglang-kt's server for ``recipe`` serving ``served`` (core/served.py): a converted adapter (LoRA),
    a full fine-tune's model (weights) or the base with the LoRA merged in by `ktdeploy merge` (a BF16 model, no
    LoRA); the host and port are the recipe's deploy.serve.

    The server starts through ``ktdeploy.agent.sglang_launch`` (sglang's own launch, in-process) so that the
    API key is read from the environment and never appears in an argv.
    A full fine-tune's output is a whole model (config, tokenizer, BF16 safetensors incl. the experts): it is
    both ``--model-path`` and ``--kt-weight-path`` (native BF16 experts are read from the model itself), no LoRA.
    ``cpuinfer`` / ``threadpools``: the flags; what is left open comes from the recipe, else ``host_threads()`` (this
    host's derivation from deploy.reserve_cores, what training used: core.checks.threads.serve_threads decides)."""
    reserve = recipe.deploy.reserve_cores if recipe.deploy is not None else 2
    cpuinfer, threadpools = serve_threads(recipe.kt_config, lambda: host_threads(reserve), cpuinfer=cpuinfer,
                                          threadpools=threadpools)
    if recipe.deploy is None:
        raise UsageError("the recipe has no valid deploy: section", key="deploy", fix="run `ktdeploy check RECIPE`")
    s = recipe.deploy.serve
    keys = recipe.keys
    model = keys.model_name_or_path
    if not model:
        raise UsageError("train.model_name_or_path is not set", key="train.model_name_or_path",
                         fix="set it to the base model directory")
    adapter_dir = served.path if served.kind == "adapter" else None
    whole = None if adapter_dir is not None else served.path
    if whole is not None:
        model = whole
    if cpuinfer < 1 or threadpools < 1:
        raise UsageError(f"--kt-cpuinfer {cpuinfer} / --kt-threadpool-count {threadpools} must be >= 1",
                         fix="run on a host with CPU facts (ktdeploy doctor) or set kt_num_threads in the recipe")
    method = kt_methods.require_serve_method(MERGED_SETUP if served.kind == "merged" else recipe.weight_setup(),
                                             lora=adapter_dir is not None)
    if adapter_dir is not None and kt_build and V.known(kt_build) and not V.get(kt_build).sft:
        raise UsageError(f"kt-kernel's {V.canonical(kt_build)} build (this image) has no SFT kernels: sglang-kt serves "
                         "a KT LoRA through kt-kernel's SFT wrapper, which that build lacks",
                         key="deploy.image", fix=f"Serve the adapter on a CPU that runs {' or '.join(V.TRAINING)} "
                                                 "(docs/cpu-builds.md); this CPU can serve a full fine-tune.")
    weights = model if whole is not None else (keys.kt_weight_path or model)
    if whole is None and isinstance(weights, str) and EPHEMERAL_ROOT.fullmatch(weights):
        raise UsageError(f"kt_weight_path {weights} is an ephemeral INT8 root: kt-kernel deleted it layer by layer "
                         "while training loaded it, and sglang-kt reads a persistent tree", key="train.kt_weight_path",
                         fix="make a persistent tree (ktdeploy prepare-weights MODEL_DIR --format int8 -o DIR) and serve "
                             "with --set train.kt_weight_path=DIR, or serve the merged model (deploy.serve.merge: true)")
    served_name = s.served_model_name or Path(str(keys.model_name_or_path)).name
    argv = [python, "-m", LAUNCHER,
            "--model-path", str(model),
            "--served-model-name", served_name,
            "--host", s.host,
            "--port", str(s.port),
            "--tp-size", str(len(recipe.deploy.gpus)),
            "--kt-weight-path", str(weights),
            "--kt-method", method,
            "--kt-cpuinfer", str(cpuinfer),
            "--kt-threadpool-count", str(threadpools),
            "--kt-num-gpu-experts", "0"]
    if adapter_dir is not None:
        argv += ["--enable-lora",
                 "--lora-backend", "triton",
                 "--lora-paths", f"{s.lora_name}={Path(adapter_dir)}",
                 "--max-loras-per-batch", "1"]
    argv += ["--max-running-requests", str(s.max_running_requests)]
    if keys.trust_remote_code:
        argv.append("--trust-remote-code")
    if s.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(s.mem_fraction_static)]
    redacted = list(argv)
    env = {"CUDA_VISIBLE_DEVICES": recipe.deploy.cuda_visible_devices, **cache_env(environ, uid)}
    if s.api_key_env:
        key = os.environ.get(s.api_key_env)
        if not key:
            raise UsageError(f"deploy.serve.api_key_env names {s.api_key_env}, which is not set",
                             key="deploy.serve.api_key_env", fix=f"export {s.api_key_env}=<key> before serving")
        # Not in argv: the launcher reads it from the variable this names (inherited from the container's env).
        env[KEY_ENV_VAR] = s.api_key_env
    argv += list(s.extra_args)
    redacted += list(s.extra_args)
    return ServeCommand(argv=argv, env=env, redacted=redacted)
