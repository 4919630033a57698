"""The reduced ktsft images, built for real from the Dockerfile, and run.

The reduced stack has the same stages as the full image (base -> deps -> agent -> amx/avx512/avx2),
with ktdeploy's own dependencies instead of the multi-GB KT stack, so the entrypoint, the ISA gate,
the labels, the user and the layer sharing are the ones the full image ships.
The session fixture runs docker/ci-build-reduced.sh (idempotent: the layer cache makes a rebuild fast).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ktdeploy.core import variants as V
from ktdeploy.core.checks.isa import best_variant
from ktdeploy.core.facts.cpu import build_cpu

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
# KTSFT_REPO / KTDEPLOY_BASE_IMAGE: build under other tags (a branch's own base and images) so a run
# never overwrites images that other checkouts' tests use.
REPO = os.environ.get("KTSFT_REPO", "ktsft-reduced")
BASE = os.environ.get("KTDEPLOY_BASE_IMAGE", "ktdeploy/base:bookworm")
VARIANTS = V.NAMES
ORDER = {v.name: v.level for v in V.LADDER}


def docker(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def images(reduced_images):
    return reduced_images


def inspect(ref: str) -> dict:
    return json.loads(docker("image", "inspect", ref).stdout)[0]


def host_best() -> str:
    """The variant this CPU should run, from its flags (this machine: avx512, no AMX)."""
    return best_variant(build_cpu(Path("/proc/cpuinfo").read_text()))


def run(image: str, *args: str, volumes: tuple[str, ...] = (), timeout: int = 180) -> subprocess.CompletedProcess:
    vol = [x for v in volumes for x in ("-v", v)]
    return docker("run", "--rm", *vol, image, *args, timeout=timeout)


def test_variants_share_every_filesystem_layer(images):
    layers = {v: inspect(ref)["RootFS"]["Layers"] for v, ref in images.items()}
    assert len(layers["amx"]) >= 5
    assert all(ls == layers["amx"] for ls in layers.values())
    # ...and differ in their config: the build they pin, named by their tag.
    envs = {v: inspect(ref)["Config"]["Env"] for v, ref in images.items()}
    for v in VARIANTS:
        assert f"KT_KERNEL_CPU_VARIANT={v}" in envs[v] and f"KTSFT_VARIANT={v}" in envs[v]
    # the old tag is the avx512_bf16 image itself (an alias: the same image ID)
    assert inspect(f"{REPO}:avx512")["Id"] == inspect(images["avx512_bf16"])["Id"]


def test_labels_record_isa_stack_and_the_locks_hash(images):
    lock_sha = hashlib.sha256((ROOT / "docker" / "requirements" / "reduced.lock").read_bytes()).hexdigest()
    for v, ref in images.items():
        labels = inspect(ref)["Config"]["Labels"]
        assert labels["io.ktdeploy.isa"] == v
        assert labels["io.ktdeploy.stack"] == "reduced"
        assert labels["io.ktdeploy.lock.sha256"] == lock_sha
        assert re.search(r"pydantic=\d", labels["io.ktdeploy.stack.versions"])
        assert labels["org.opencontainers.image.version"]


def test_identity_labels_and_headers(images):
    labels = inspect(images["amx"])["Config"]["Labels"]
    assert re.fullmatch(r"[0-9a-f]{64}", labels["io.ktdeploy.content.manifest.sha256"])
    assert labels["org.opencontainers.image.base.digest"] == inspect(BASE)["Id"]
    assert labels["org.opencontainers.image.revision"] and labels["org.opencontainers.image.created"]
    # Triton compiles its launcher against Python.h at the first kernel launch.
    proc = docker("run", "--rm", "--entrypoint", "test", images["amx"], "-f", "/usr/include/python3.11/Python.h")
    assert proc.returncode == 0


def test_a_version_bump_keeps_every_dependency_layer(images):
    """The version is a label of the final commit, not a build argument: bumping it rebuilds nothing
    below ktdeploy's own files (before, it was an ARG of the deps stage and re-ran the install)."""
    from ktdeploy.controller.images.build import BuildOptions, build

    repo = f"{REPO}-bump"
    try:
        report = build(BuildOptions(context=ROOT, isas=["avx2"], stack="reduced", repo=repo, base_image=BASE,
                                    version="0.0.0+bump"))
        bumped = inspect(f"{repo}:avx2")
        before = inspect(images["avx2"])
        assert bumped["Config"]["Labels"]["org.opencontainers.image.version"] == "0.0.0+bump"
        # every layer, ktdeploy's own too: the same light stage gives the same layer tar (same diff ID)
        assert bumped["RootFS"]["Layers"] == before["RootFS"]["Layers"]
        assert report.method == "layer"
        # the untagged image the verification ran in is gone; its layers live on in the tagged ones
        assert report.verified_image and docker("image", "inspect", report.verified_image).returncode != 0
        # Same sources, same bytes: the content manifest does not move either.
        assert report.manifest_sha256 == before["Config"]["Labels"]["io.ktdeploy.content.manifest.sha256"]
    finally:
        docker("rmi", f"{repo}:avx2")


def test_the_variants_are_loaded_on_top_of_the_dependency_layers_with_their_history(images):
    """No commit of the big tree: light's layer arrives by `docker load`, and `docker history` still tells each
    dependency layer's instruction (not an anonymous import)."""
    from ktdeploy.controller.images.image_config import LAYER_COMMENT

    out = docker("history", "--no-trunc", "--human=false", "--format", "{{json .}}", images["amx"]).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["CreatedBy"] == LAYER_COMMENT and int(rows[0]["Size"]) > 0
    assert any("lockpart.py" in r["CreatedBy"] for r in rows)
    assert not any("(dependency image layer" in r["CreatedBy"] for r in rows)
    assert rows[-1]["Comment"].startswith("debootstrap")


def test_the_tagged_image_holds_exactly_what_was_verified(images):
    """The content manifest computed again inside the tagged image (as its kt user, no cache) equals the label
    the verification wrote before the tag existed."""
    ref = images["avx2"]
    proc = docker("run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python", ref, "-B",
                  "/opt/ktdeploy/verify/verify_stack.py", "--stack", "reduced", "--stage", "agent", "--stack-file",
                  "/opt/ktdeploy/verify/stack.toml", "--lock", "/opt/ktdeploy/requirements.lock", "--manifest")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"manifest sha256=([0-9a-f]{64})", proc.stdout)
    assert found and found.group(1) == inspect(ref)["Config"]["Labels"]["io.ktdeploy.content.manifest.sha256"]


def test_an_engine_refusing_the_sparse_archive_gets_the_same_image_by_commit(images, monkeypatch):
    """Where `docker load` wants every layer (an image store that keeps blobs), the build commits instead: same
    files (content manifest), same config, same dependency layers."""
    from ktdeploy.controller.images import build as build_mod
    from ktdeploy.controller.images.layer_load import LayerLoadUnsupported

    def refuse(_archive):
        raise LayerLoadUnsupported("this engine wants every layer in a loaded archive", fix="commit")

    monkeypatch.setattr(build_mod, "load_archive", refuse)
    repo = f"{REPO}-commit"
    try:
        report = build_mod.build(build_mod.BuildOptions(context=ROOT, isas=["avx2"], stack="reduced", repo=repo,
                                                        base_image=BASE))
        assert report.method == "commit"
        got, want = inspect(f"{repo}:avx2"), inspect(images["avx2"])
        assert got["RootFS"]["Layers"][:-1] == want["RootFS"]["Layers"][:-1]
        assert len(got["RootFS"]["Layers"]) == len(want["RootFS"]["Layers"])
        for key in ("Env", "User", "WorkingDir", "Entrypoint", "Cmd"):
            assert got["Config"][key] == want["Config"][key], key
        # when and from which commit: source identity, not content (a tree edited between two builds changes it)
        skip = {"org.opencontainers.image.created", "org.opencontainers.image.revision"}
        assert {k: v for k, v in got["Config"]["Labels"].items() if k not in skip} == \
            {k: v for k, v in want["Config"]["Labels"].items() if k not in skip}
    finally:
        # --no-prune: a committed image's parent is the deps stage's image; a plain rmi also deleted that untagged
        # chain (the build cache), so the next build of the deps stage made new layers (found looping this test)
        docker("rmi", "--no-prune", f"{repo}:avx2")
    with pytest.raises(LayerLoadUnsupported):   # --method layer does not fall back
        build_mod.build(build_mod.BuildOptions(context=ROOT, isas=["avx2"], stack="reduced", repo=repo,
                                               base_image=BASE, method="layer"))


def test_runs_as_the_unprivileged_kt_user(images):
    proc = docker("run", "--rm", "--entrypoint", "id", images["avx2"])
    assert proc.returncode == 0 and proc.stdout.startswith("uid=1000(kt) gid=1000(kt)")


def test_probes_were_compiled_into_the_image(images):
    proc = docker("run", "--rm", "--entrypoint", "/opt/ktdeploy/probes/amx_probe", images["avx2"])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict) and out


def test_doctor_json_in_the_matching_variant(images):
    best = host_best()
    proc = run(images[best], "doctor", "--json")
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("cpu.isa.avx2", "cpu.isa.avx512", "cpu.variant", "memory.host", "numa.mempolicy"):
        assert name in checks, name
    assert checks["cpu.variant"]["status"] == "pass"
    assert checks["cpu.isa.avx2"]["status"] == "pass"
    assert report["facts"]["layer"] == "container"
    # No GPU on the CI machine: doctor says so and exits non-zero, as it must.
    failing = sorted(n for n, c in checks.items() if c["status"] == "fail")
    assert (proc.returncode != 0) == bool(failing), failing


def test_variant_above_this_cpu_is_refused_naming_the_right_one(images):
    best = host_best()
    above = [v for v in VARIANTS if ORDER[v] > ORDER[best]]
    if not above:
        pytest.skip(f"this CPU runs every variant (best: {best})")
    for v in above:
        proc = run(images[v], "doctor")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        err = " ".join(proc.stderr.split())
        assert f"cannot run the ktsft:{v} image" in err
        assert f"ktsft:{best}" in err
        assert "Traceback" not in proc.stderr


def test_hidden_cpu_flags_make_the_avx512_builds_refuse_naming_avx2(images, tmp_path):
    """A container whose /proc/cpuinfo hides avx512 (as a restrictive hypervisor CPU model would)."""
    text = Path("/proc/cpuinfo").read_text()
    hidden = re.sub(r"(?m)^(flags\s*:.*)$",
                    lambda m: " ".join(f for f in m.group(1).split(" ") if not f.startswith(("avx512", "amx"))),
                    text)
    assert "avx512f" not in hidden and " avx2" in hidden
    fake = tmp_path / "cpuinfo"
    fake.write_text(hidden)
    vol = (f"{fake}:/proc/cpuinfo:ro",)
    proc = run(images["avx512_base"], "doctor", volumes=vol)
    assert proc.returncode == 1
    err = " ".join(proc.stderr.split())
    assert "cannot run the ktsft:avx512_base image" in err and "ktsft:avx2" in err
    ok = run(images["avx2"], "doctor", "--json", volumes=vol)
    checks = {c["name"]: c for c in json.loads(ok.stdout)["checks"]}
    assert checks["cpu.variant"]["status"] == "pass" and "avx2" in checks["cpu.variant"]["detail"]


def test_pure_commands_run_on_any_cpu(images, tmp_path):
    """check/render never touch kt-kernel: even the amx image runs them here."""
    recipes = ROOT / "recipes"
    out = tmp_path / "rendered"
    out.mkdir()
    out.chmod(0o777)
    proc = run(images["amx"], "check", str(recipes / "tiny-moe-lora.yaml"), volumes=(f"{recipes}:{recipes}:ro",))
    assert proc.returncode == 0, proc.stderr
    proc = run(images["amx"], "render", str(recipes / "tiny-moe-lora.yaml"), "-o", str(out / "r"),
               volumes=(f"{recipes}:{recipes}:ro", f"{out}:{out}"))
    assert proc.returncode == 0, proc.stderr
    assert "use_kt: true" in (out / "r" / "train.yaml").read_text()
    assert (out / "r" / "accelerate.yaml").is_file()


def test_train_dry_run_in_the_image(images):
    recipes = ROOT / "recipes"
    recipe = str(recipes / "tiny-moe-lora.yaml")
    vol = (f"{recipes}:{recipes}:ro",)
    image = images[host_best()]
    plan = run(image, "train", recipe, "--dry-run", "--skip-doctor", "--json", volumes=vol)
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["argv"][:3] == ["/opt/venv/bin/python", "-m", "accelerate.commands.launch"] or \
        data["argv"][1:3] == ["-m", "accelerate.commands.launch"]
    assert "kt_config:" in data["train_yaml"] and "num_processes" in data["accelerate_yaml"]
    # With the doctor (the default), a host without a GPU is refused, naming the check.
    refused = run(image, "train", recipe, "--dry-run", volumes=vol)
    assert refused.returncode != 0
    assert "gpu.present" in refused.stdout + refused.stderr


def test_a_wrong_stack_fails_the_build(images, tmp_path):
    """The build refuses to produce an image whose installed versions disagree with stack.toml."""
    from ktdeploy.controller.images.build import snapshot_context

    ctx = snapshot_context(ROOT, tmp_path / "ctx")
    stack = ctx / "docker" / "stack.toml"
    stack.write_text(stack.read_text().replace("[reduced.expect.dist]\n", '[reduced.expect.dist]\npydantic = "0.0.1"\n'))
    proc = subprocess.run(
        [_python(), "-m", "ktdeploy", "image", "build", "--stack", "reduced", "--isa", "avx2", "--repo",
         f"{REPO}-wrongstack", "--base-image", BASE, "--context", str(ctx), "--wheelhouse", str(ROOT / ".wheelhouse" / "reduced")],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "verify_stack: FAILED" in proc.stderr
    assert "distribution pydantic: installed" in proc.stderr and "want 0.0.1" in proc.stderr
    assert docker("image", "inspect", f"{REPO}-wrongstack:avx2").returncode != 0


def test_save_and_load_round_trip(images, tmp_path):
    tag = f"{REPO}-savetest:avx2"
    assert docker("tag", images["avx2"], tag).returncode == 0
    image_id = inspect(tag)["Id"]
    archive = tmp_path / "ktsft.tar"
    try:
        proc = subprocess.run([_python(), "-m", "ktdeploy", "image", "save", "--repo", f"{REPO}-savetest",
                               "--isa", "avx2", "-o", str(archive)], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert archive.stat().st_size > 100_000_000
        assert docker("rmi", tag).returncode == 0
        proc = subprocess.run([_python(), "-m", "ktdeploy", "image", "load", "--repo", f"{REPO}-savetest", str(archive)],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert tag in proc.stdout
        assert inspect(tag)["Id"] == image_id
        # Never overwrite an existing archive.
        again = subprocess.run([_python(), "-m", "ktdeploy", "image", "save", "--repo", f"{REPO}-savetest",
                                "--isa", "avx2", "-o", str(archive)], capture_output=True, text=True, cwd=ROOT)
        assert again.returncode == 2 and "already exists" in again.stderr
    finally:
        docker("rmi", tag)


def _python() -> str:
    import sys

    return sys.executable


def test_build_refuses_early_without_base_image_or_wheels(images, tmp_path):
    """No registry here: a missing base image or wheelhouse is a one-screen error, not a pull attempt."""
    base = subprocess.run([_python(), "-m", "ktdeploy", "image", "build", "--stack", "reduced", "--isa", "avx2",
                           "--repo", f"{REPO}-nobase", "--base-image", "ktdeploy/no-such-base:1"], capture_output=True, text=True, cwd=ROOT)
    assert base.returncode == 5 and "build-base.sh" in " ".join(base.stderr.split())
    empty = tmp_path / "wheels"
    empty.mkdir()
    wh = subprocess.run([_python(), "-m", "ktdeploy", "image", "build", "--stack", "reduced", "--isa", "avx2",
                         "--wheelhouse", str(empty)], capture_output=True, text=True, cwd=ROOT)
    assert wh.returncode == 5
    assert "docker/wheelhouse.py --stack reduced" in " ".join(wh.stderr.split())
    assert "Traceback" not in base.stderr + wh.stderr


def test_the_stack_judge_says_the_reduced_image_has_no_stack(images, tmp_path):
    """`check --stack` in the reduced image (ktdeploy without the ML stack): the judge runs the image's own ktdeploy
    and answers "absent", naming what is missing: exit 7, distinct from a refusal (2). From the controller (docker
    run of the judge in the image) and inside the image (its own CLI) alike."""
    import sys

    image = images[host_best()]
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "check", str(ROOT / "recipes" / "tiny-moe-lora.yaml"),
                        "--stack", "--image", image], capture_output=True, text=True, timeout=600, cwd=ROOT)
    said = " ".join(r.stderr.split())     # the error panel wraps its lines
    assert r.returncode == 7, (r.stdout, r.stderr)
    assert "no LlamaFactory/kt-kernel stack" in said and "torch" in said and "Traceback" not in said
    recipes = ROOT / "recipes"
    inside = run(image, "check", str(recipes / "tiny-moe-lora.yaml"), "--stack", "--json",
                 volumes=(f"{recipes}:{recipes}:ro",), timeout=600)
    assert inside.returncode == 7, (inside.stdout, inside.stderr)
    assert "no LlamaFactory/kt-kernel stack" in " ".join((inside.stdout + inside.stderr).split())
    missing = subprocess.run([sys.executable, "-m", "ktdeploy", "check", str(recipes / "tiny-moe-lora.yaml"),
                              "--stack", "--image", "ktdeploy-no-such-image:1"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    assert missing.returncode == 7 and "is not on" in " ".join(missing.stderr.split()), missing.stderr


def test_the_serving_container_starts_as_a_uid_absent_from_passwd(images, tmp_path):
    """`up`'s serving container (dk.create_serve: --user of the SSH user) runs `ktdeploy serve` through the image's
    entrypoint as uid 4242, which the image's passwd does not list. sglang-kt (here its TEST DOUBLE, same cache
    rule, tests/fakes/sglang_pkg) splits the adapter into $SGLANG_KT_LORA_CACHE_DIR; without it getpass.getuser()
    raises and the server never starts (what happened before ktdeploy set the variable)."""
    import yaml

    from ktdeploy.agent.convert import convert
    from ktdeploy.core.plan import docker_argv as dk
    from ktdeploy.core.plan.host_plan import shipped_recipe
    from ktdeploy.core.recipe import builtin_recipe, load_recipe
    from ktdeploy.core.recipe.render import dump_yaml
    from ktdeploy.core.served import Served
    from tests.fakes.kt_layout import write_lora_adapter

    models, data, outputs, job, report = (tmp_path / n for n in ("models", "data", "out", "job", "report"))
    for d in (models, data, outputs, job, report):
        d.mkdir()
    report.chmod(0o777)
    model = models / "tiny"
    model.mkdir()
    raw = outputs / "run"
    raw.mkdir()
    write_lora_adapter(str(raw), base=str(model))
    convert(raw, outputs / "run-sglang", base_model=str(model))
    for p in outputs.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    recipe = load_recipe(builtin_recipe(), [f"deploy.volumes.model={models}", f"deploy.volumes.data={data}",
                                            f"deploy.volumes.output={outputs}", f"train.model_name_or_path={model}",
                                            f"train.dataset_dir={data}", f"train.output_dir={raw}"])
    (job / "recipe.yaml").write_text(dump_yaml(shipped_recipe(recipe, None)))
    assert yaml.safe_load((job / "recipe.yaml").read_text())["deploy"]["volumes"]["output"] == str(outputs)
    name = f"ktd-serveisa-uid-{os.getpid()}"
    argv = dk.create_serve(name=name, image=images[host_best()], run_id="uid-test", volumes=recipe.deploy.volumes,
                           output_dir=str(raw), served=Served("adapter", str(outputs / "run-sglang")), gpus=None,
                           memlock=False,
                           user="4242:4242")
    assert argv[argv.index("--user") + 1] == "4242:4242"
    i = argv.index("--restart")
    del argv[i:i + 2]                   # the double exits once it has reported; no restart loop in a test
    argv += ["--waive", "gpu.present"]   # no GPU here: the double stands in for sglang-kt, which would need one
    cut = argv.index("--")
    argv[cut:cut] = ["--mount", f"type=bind,source={ROOT / 'tests/fakes/sglang_pkg'},target=/fake,readonly",
                     "--mount", f"type=bind,source={report},target=/report", "--env", "PYTHONPATH=/fake",
                     "--env", "FAKE_SGLANG_REPORT=/report/r.json", "--env", "FAKE_SGLANG_SECRET="]
    try:
        assert docker(*argv[1:]).returncode == 0
        assert docker("cp", "--", f"{job}/.", f"{name}:{dk.JOB_MOUNT}").returncode == 0
        started = docker("start", "--attach", "--", name, timeout=300)
        if not V.get(host_best()).sft:
            # a CPU whose best build has no SFT kernels (AVX2-only, say) cannot serve a LoRA: refused, nothing served
            said = " ".join((started.stdout + started.stderr).split())
            assert started.returncode == 2 and "has no SFT kernels" in said, said[-2000:]
            return
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    finally:
        docker("rm", "--force", "--", name)
    got = json.loads((report / "r.json").read_text())
    assert got["uid"] == 4242 and got["home"] == "/tmp"
    assert got["kt_expert_lora_path"].startswith("/tmp/.cache/ktdeploy-4242/sglang-kt-lora/")
    assert got["enable_lora"] and got["lora_paths"] == [f"tiny-lora={outputs / 'run-sglang'}"]
