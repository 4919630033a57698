"""Hostile recipe values in the batch files (Probe 3's F1, F10): sbatch reads ``#SBATCH`` lines with its own
tokenizer (Slurm src/sbatch/opt.c ``_get_argument``: blanks split options, ``'…'``/``"…"`` quote, ``\\`` escapes the
next character, an unquoted ``#`` ends the line); ``sbatch_tokens`` below is that reader, so a test sees exactly the
options sbatch would. A value never adds an option, a control character is refused naming the key, and `render`
to a terminal shows control characters as escapes. Each test: the attack as the probe made it, then the behaviour
that must hold — a refusal naming the key, the reason and the fix, a documented exit code, no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.plan.host_plan import shipped_recipe
from ktdeploy.core.recipe import load_recipe, validate
from ktdeploy.core.recipe.finding import errors
from ktdeploy.core.sched.batch import Launch, convert_script, job_dir_of, train_script
from ktdeploy.core.sched.job_files import k8s_manifests
from ktdeploy.core.sched.request import request_for
from ktdeploy.core.sched.runtimes import RUNTIMES
from tests.unit.adversarial.harness import invoke, problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


def tiny(*sets):
    return load_recipe(TINY, ["deploy.scheduler.cpus=4", *sets])


def sbatch_tokens(line: str) -> list[str]:
    """The options sbatch reads from one ``#SBATCH`` line (after the ``#SBATCH`` word)."""
    rest, out, i = line[len("#SBATCH"):], [], 0
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            return out
        arg, quote, escape = [], None, False
        while i < len(rest) and (quote or not rest[i].isspace()) and rest[i] != "\n":
            c = rest[i]
            if escape:
                escape = False
            elif c == "\\":
                escape, i = True, i + 1
                continue
            elif quote:
                if c == quote:
                    quote, i = None, i + 1
                    continue
            elif c in "\"'":
                quote, i = c, i + 1
                continue
            elif c == "#":
                out.append("".join(arg))
                return [a for a in out if a]
            arg.append(c)
            i += 1
        out.append("".join(arg))


def sbatch_options(script: str) -> list[str]:
    """Every option the header gives sbatch (the header ends at the first line that is not a comment)."""
    opts = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            opts += sbatch_tokens(line)
    return opts


HOSTILE_DIRS = ["o --uid=0", "o' --partition=evil '", 'o" --account=x "', "o #comment", "o%u%x", "o;$(touch pwned)",
                "o\t--uid=0"]


@pytest.mark.parametrize("name", HOSTILE_DIRS)
def test_f1_output_volume_never_adds_an_sbatch_option(tmp_path, name):
    vol = tmp_path / name
    sets = [f"deploy.volumes.output={vol}", f"train.output_dir={vol}/run"]
    if "\t" in name:     # a control character cannot be written on one #SBATCH line: check refuses it, naming the key
        errs = errors(validate(tiny(*sets)))
        assert {"deploy.volumes.output", "train.output_dir"} <= {f.path for f in errs}
        return
    r = tiny(*sets)
    req = request_for(r, "amx")
    jobs = []
    for runtime in RUNTIMES:
        launch = Launch(runtime=runtime, image="registry.example.com/ktsft:amx")
        jobs += [train_script(r, shipped_recipe(r, None), run_id="R", request=req, launch=launch),
                 convert_script(r, run_id="R", request=req, launch=launch)]
    for job in jobs:
        opts = sbatch_options(job.script)
        names = [o.split("=", 1)[0] for o in opts]
        assert set(names) <= {"--job-name", "--output", "--open-mode", "--time", "--mem", "--cpus-per-task", "--hint",
                              "--gres", "--constraint", "--requeue", "--signal", "--no-requeue"}, opts
        assert len(names) == len(set(names)), opts
        out = next(o.split("=", 1)[1] for o in opts if o.startswith("--output="))
        assert out == f"{job_dir_of(r).replace('%', '%%')}/{job.role}-%j.out"
        assert subprocess.run(["bash", "-n"], input=job.script, text=True, capture_output=True).returncode == 0


def test_f1_backslash_in_the_output_volume_is_refused_for_slurm(tmp_path):
    r = tiny(f"deploy.volumes.output={tmp_path}/a\\b", f"train.output_dir={tmp_path}/a\\b/run")
    with pytest.raises(RecipeError) as e:
        train_script(r, shipped_recipe(r, None), run_id="R", request=request_for(r, "amx"),
                     launch=Launch(runtime="podman", image="ktsft:amx"))
    assert e.value.key == "deploy.volumes.output" and e.value.fix


@pytest.mark.parametrize("key,value", [("train.output_dir", "/srv/ktdeploy/output/run\n#SBATCH --uid=0"),
                                       ("train.output_dir", "/srv/ktdeploy/output/r\x1b]0;owned\x07"),
                                       ("deploy.image_repo", "ktsft\r"),
                                       ("deploy.serve.extra_args", ["--x", "a\nb"])])
def test_f1_control_characters_refused_at_check_naming_the_key(key, value):

    r = load_recipe(TINY, [f"{key}={json.dumps(value)}"])
    errs = errors(validate(r))
    assert any(f.path.startswith(key) and f.fix for f in errs), [(f.path, f.message) for f in errs]


def test_f1_check_cli_refuses_a_newline_volume_cleanly(tmp_path):
    recipe = tmp_path / "r.yaml"
    text = TINY.read_text()
    assert "    output: output\n" in text   # deploy.volumes.output, relative to deploy.root
    recipe.write_text(text.replace("    output: output\n", '    output: "/srv/ktdeploy/output\\n#SBATCH --uid=0"\n'))
    rc, out, _ = invoke(["check", str(recipe)], cwd=tmp_path)
    assert rc == 2 and "deploy.volumes.output" in out and not problems(rc, out)
    rc, out, _ = invoke(["render", "--slurm", "--variant", "amx", "--set", "deploy.scheduler.cpus=4", str(recipe)],
                        cwd=tmp_path)
    assert rc == 2 and "#SBATCH --uid" not in out.replace("\\n#SBATCH", "") and not problems(rc, out)


def test_f1_k8s_manifests_come_from_the_yaml_library_and_a_bad_namespace_is_refused():

    import yaml

    odd = "/srv/o: x\" #y"
    r = tiny(f"deploy.volumes.output={json.dumps(odd)}", f"train.output_dir={json.dumps(odd + '/run')}",
             "deploy.registry=registry.example.com/ml")
    assert r.deploy.volumes.output == odd
    from ktdeploy.core.sched.k8s import render_yaml

    docs = k8s_manifests(r, "amx")
    assert list(yaml.safe_load_all(render_yaml(docs))) == docs     # a path with ': ', '"', '#' round-trips
    for ns in ("default\nkind: Secret", "Evil", "-x", "a" * 64, ""):
        with pytest.raises(UsageError) as e:
            k8s_manifests(r, "amx", namespace=ns)
        assert e.value.key == "--namespace"


# -- F10: render --slurm/--k8s to a terminal ----------------------------------------------------------------------
def _on_a_terminal(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit code, everything it printed)."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def test_f10_render_to_a_terminal_shows_control_characters_as_escapes():
    import sys

    bidi = "a\u202eb\u2066c"
    rc, out = _on_a_terminal([sys.executable, "-m", "ktdeploy", "render", "--k8s", "--variant", "amx", "--set",
                              "deploy.scheduler.cpus=4", "--set", "deploy.registry=registry.example.com/ml", "--set",
                              f"train.run_name={json.dumps(bidi)}", str(TINY)])
    assert rc == 0, out
    assert "kind: Job" in out and "a\\u202eb\\u2066c" in out
    assert "\u202e" not in out and "\u2066" not in out
