"""ansible/site.yml on configured hosts: --check --diff changes nothing, images roll out by ID (a stale host is
updated, a replaced tarball fails with "digest mismatch", no copy without the disk space), and docker is installed
from local .deb files on a host that lacks it - on ansible-core 2.19 (this venv) and 2.16 (a cached venv).

Hosts: sshd test hosts sharing this machine's docker engine (tests/integration/hosts.py), AMX hidden on every one
(the fleet reads the same on AMX and non-AMX machines). No GPU: gpu.present / docker.nvidia_runtime are waived, and
cpu.amx.cpuid (which sees through the hidden AMX on an AMX machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ktdeploy.controller.images.identity import read_sidecar, write_sidecar
from tests.integration.hosts import docker, ensure_image
from tests.integration.test_ansible_fleet import AMX, HEALTHY, WAIVE, V, make_image_archive, recap, write_inventory
from tests.integration.test_ansible_fleet import playbook as _playbook

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "tests" / ".cache"
BIN = Path(sys.executable).parent


def ansible_216() -> Path:
    """A venv with ansible-core 2.16 that imports ktdeploy from this checkout (cached in tests/.cache)."""
    venv = CACHE / "ansible-2.16"
    if not (venv / "bin" / "ansible-playbook").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ansible-core>=2.16,<2.17"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"cannot install ansible-core 2.16: {p.stderr[-300:]}")
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next((BIN.parent / "lib").glob("python3*/site-packages"))
    # after its own site-packages: ansible 2.16 wins, ktdeploy and its deps come from this venv
    (site / "ktdeploy-fleet.pth").write_text(f"{REPO}\n{ours}\n")
    return venv / "bin"


@pytest.fixture(scope="module", params=["2.19", "2.16"])
def ansible_bin(request):
    if request.param == "2.19":
        v = subprocess.run([str(BIN / "ansible-playbook"), "--version"], capture_output=True, text=True).stdout
        assert "core 2.19" in v, v[:200]
        return BIN
    b = ansible_216()
    assert "core 2.16" in subprocess.run([str(b / "ansible-playbook"), "--version"], capture_output=True, text=True).stdout
    return b


def playbook(inv, *extra, summary, ansible=BIN, **kw):
    env_path = os.environ["PATH"]
    os.environ["PATH"] = f"{ansible}{os.pathsep}{env_path}"
    try:
        import tests.integration.test_ansible_fleet as tf
        saved, tf.BIN = tf.BIN, ansible
        try:
            return _playbook(inv, *extra, summary=summary, **kw)
        finally:
            tf.BIN = saved
    finally:
        os.environ["PATH"] = env_path


@pytest.fixture(scope="module")
def rollout(host_pool, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout")
    repo = f"ktroll-{host_pool.tag}/ktsft"
    archive_dir = make_image_archive(tmp, repo, V)
    h = host_pool.start("roll-ok", extra=HEALTHY, hide_flags=AMX)
    inv = write_inventory(tmp / "inventory.yml", host_pool, {"roll-ok": (h, {})}, ktdeploy_image_repo=repo,
                          ktsft_image_archive_dir=str(archive_dir))
    rc, out, rows = playbook(inv, summary=tmp / "s0.json")
    assert rc == 0 and rows["roll-ok"]["status"] == "ok", out[-4000:]
    archive = archive_dir / f"ktsft-{V}.tar"
    yield {"tmp": tmp, "inv": inv, "host": h, "repo": repo, "ref": f"{repo}:{V}", "archive": archive,
           "id": read_sidecar(archive)["images"][f"{repo}:{V}"]}
    docker("rmi", "-f", f"{repo}:{V}", f"{repo}:other", f"{repo}:other2", check=False)


def other_image(tmp: Path, ref: str, text: str) -> str:
    src = tmp / f"rootfs-{text}.tar"
    payload = tmp / f"payload-{text}"
    payload.write_text(text)
    with tarfile.open(src, "w") as t:
        t.add(payload, arcname="VARIANT")
    docker("import", "--change", f"LABEL io.ktdeploy.isa={V}", str(src), ref)
    return docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def host_id(ref: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).stdout.strip()


def test_check_diff_on_a_configured_fleet_changes_nothing(rollout, ansible_bin):
    rc, out, rows = playbook(rollout["inv"], "--check", "--diff", "-e", "preflight_wheelhouse_build=false",
                             summary=rollout["tmp"] / "check.json", ansible=ansible_bin)
    r = recap(out)
    assert rc == 0 and r["roll-ok"]["changed"] == 0 and r["roll-ok"]["failed"] == 0, out[-4000:]
    assert rows["roll-ok"]["status"] == "ok"   # doctor ran for real under --check (read-only)


def test_a_replaced_tarball_fails_with_digest_mismatch(rollout):
    tmp = rollout["tmp"]
    other_image(tmp, f"{rollout['repo']}:other", "stale")
    docker("tag", f"{rollout['repo']}:other", rollout["ref"])          # the host's tag points at another build
    bad_dir = tmp / "bad"
    bad_dir.mkdir()
    other_image(tmp, f"{rollout['repo']}:other2", "retagged")
    docker("tag", f"{rollout['repo']}:other2", rollout["ref"])         # someone retagged and saved it
    bad = bad_dir / rollout["archive"].name
    docker("save", "-o", str(bad), rollout["ref"])
    recorded = dict(read_sidecar(rollout["archive"]))
    # a new sidecar beside the bad tarball (write_sidecar never writes over one): its sha256, the recorded IDs
    data = write_sidecar(bad, recorded["images"])
    assert data["images"][rollout["ref"]] == rollout["id"] != host_id(rollout["ref"])
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false",
                             "-e", f"ktsft_image_archive_dir={bad_dir}", summary=tmp / "bad.json")
    assert rc != 0 and "digest mismatch" in out and rollout["id"] in out, out[-4000:]
    assert rows["roll-ok"]["status"].startswith("FAILED ktsft_image"), rows


def test_no_copy_without_free_disk(rollout):
    docker("tag", f"{rollout['repo']}:other", rollout["ref"])
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false",
                             "-e", "ktsft_image_disk_factor=1e9", summary=rollout["tmp"] / "disk.json")
    assert rc != 0 and "not enough free disk" in out, out[-3000:]
    assert "TASK [ktsft_image : Copy the tarball]" not in out.split("not enough free disk")[0][-20000:] or \
        "changed: [roll-ok]" not in out.split("TASK [ktsft_image : Copy the tarball]")[-1].split("TASK [")[0]


def test_a_stale_image_is_updated_then_left_alone(rollout):
    docker("tag", f"{rollout['repo']}:other", rollout["ref"])          # stale: same tag, older build
    assert host_id(rollout["ref"]) != rollout["id"]
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false", summary=rollout["tmp"] / "u1.json")
    r = recap(out)
    assert rc == 0 and r["roll-ok"]["changed"] >= 1, out[-4000:]
    assert "changed: [roll-ok]" in out.split("TASK [ktsft_image : Load the tarball into docker]")[1].split("TASK [")[0]
    assert host_id(rollout["ref"]) == rollout["id"]
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false", summary=rollout["tmp"] / "u2.json")
    assert rc == 0 and recap(out)["roll-ok"]["changed"] == 0, out[-4000:]


def test_the_image_check_fails_a_host_whose_image_cannot_run(rollout):
    """ktsft_image runs `ktdeploy doctor --image REF --json` on the host after the rollout (the training flags,
    the host's waivers): the rolled-out tarball image holds no program (not even `sleep`), so image.run fails the
    host with doctor's detail; waived (ktdeploy_waive_checks, as doctor's --waive) the host passes."""
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false", "-e", "ktsft_image_check=true",
                             summary=rollout["tmp"] / "chk1.json")
    assert rc != 0 and "is not ready on roll-ok" in out and "image.run (container)" in out, out[-4000:]
    assert rows["roll-ok"]["status"].startswith("FAILED ktsft_image"), rows
    waive = json.dumps({"ktdeploy_waive_checks": [*WAIVE, "image.run"], "ktsft_image_check": True})
    rc, out, rows = playbook(rollout["inv"], "-e", "preflight_wheelhouse_build=false", "-e", waive,
                             summary=rollout["tmp"] / "chk2.json")
    assert rc == 0, out[-4000:]
    assert "ok: [roll-ok]" in out.split("TASK [ktsft_image : Check the image in a training container")[1].split("TASK [")[0]


def local_debs() -> list[Path]:
    """docker.io's .deb from Debian's mirror, downloaded once into tests/.cache/debs (git-ignored)."""
    d = CACHE / "debs"
    debs = sorted(d.glob("docker.io_*.deb"))
    if not debs:
        d.mkdir(parents=True, exist_ok=True)
        p = docker("run", "--rm", "--entrypoint", "sh", "-v", f"{d}:/out", ensure_image(), "-c",
                   "apt-get update -qq && cd /out && apt-get download docker.io", check=False, timeout=600)
        debs = sorted(d.glob("docker.io_*.deb"))
        if not debs:
            pytest.skip(f"docker.io .deb not cached and not downloadable: {p.stderr[-300:]}")
    return debs


def test_docker_is_installed_from_local_debs_on_a_host_without_it(host_pool, tmp_path, ansible_bin):
    debs = local_debs()
    h = host_pool.start(f"nodocker-{ansible_bin.parent.name[-4:].replace('.', '')}", extra=HEALTHY, hide_flags=AMX)
    h.exec("dpkg", "--remove", "docker.io")                              # no docker CLI (its deps stay)
    assert h.exec("sh", "-c", "command -v docker", check=False).returncode != 0
    archive_dir = make_image_archive(tmp_path, f"ktdeb-{host_pool.tag}/ktsft", V)
    inv = write_inventory(tmp_path / "inv.yml", host_pool, {"nodocker": (h, {})},
                          ktdeploy_image_repo=f"ktdeb-{host_pool.tag}/ktsft", ktsft_image_archive_dir=str(archive_dir),
                          # a box being provisioned: docker is what this play installs
                          ktdeploy_waive_checks=[*WAIVE, "docker.present"],
                          container_runtime_debs=[str(p) for p in debs], container_runtime_start_service=False)
    try:
        rc, out, rows = playbook(inv, summary=tmp_path / "d1.json", ansible=ansible_bin)
        assert rc == 0 and rows["nodocker"]["status"] == "ok", out[-4000:]
        task = out.split("TASK [container_runtime : Install docker from the local .deb packages", 1)[1].split("TASK [", 1)[0]
        assert "changed: [nodocker]" in task, task
        assert h.exec("docker", "version", "--format", "{{.Client.Version}}").returncode == 0
        rc, out, rows = playbook(inv, "-e", "preflight_wheelhouse_build=false", summary=tmp_path / "d2.json",
                                 ansible=ansible_bin)
        assert rc == 0 and recap(out)["nodocker"]["changed"] == 0, out[-4000:]
    finally:
        docker("rmi", "-f", f"ktdeb-{host_pool.tag}/ktsft:{V}", check=False)
        h.stop()
