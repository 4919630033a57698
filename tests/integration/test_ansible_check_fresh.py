"""Issue 45, class 6: `ansible-playbook --check` on a fresh host. The ktsft_image role read the free space of
the image folder with `df FOLDER`; under --check that folder is not made, so the dry run of a host that never had
ktdeploy failed there ("df: …: No such file or directory"). It now reads the disk of the nearest existing parent:
the dry run passes and leaves nothing on the host.

The role runs on its own (a two-line play) on a fresh sshd test host, with the variant given (what preflight
would choose) and a tiny labelled image saved where the role looks for it (test_ansible_fleet.make_image_archive)."""

from __future__ import annotations

import secrets

import pytest

from tests.integration.hosts import docker
from tests.integration.test_ansible_fleet import ANSIBLE, V, make_image_archive, playbook, recap, write_inventory

pytestmark = pytest.mark.docker


def test_the_image_role_dry_runs_on_a_fresh_host(host_pool, tmp_path, monkeypatch):
    repo = f"ktfresh-{host_pool.tag}/ktsft"
    archive_dir = make_image_archive(tmp_path, repo, V)
    h = host_pool.start(f"fresh-{secrets.token_hex(2)}")
    home = f"/opt/ktd-fresh-{secrets.token_hex(4)}"
    inv = write_inventory(tmp_path / "inventory.yml", host_pool, {"fresh": (h, {})}, ktdeploy_image_repo=repo,
                          ktsft_image_archive_dir=str(archive_dir), ktdeploy_home=home, preflight_variant=V)
    play = tmp_path / "image.yml"
    play.write_text("- hosts: ktdeploy_fleet\n  gather_facts: false\n  roles: [ktsft_image]\n")
    monkeypatch.setenv("ANSIBLE_FILTER_PLUGINS", str(ANSIBLE / "filter_plugins"))   # beside site.yml, not this play
    try:
        rc, out, _rows = playbook(inv, "--check", summary=tmp_path / "s.json", playbook_file=str(play))
        r = recap(out)
        assert rc == 0 and r["fresh"]["failed"] == 0, out[-4000:]
        assert "Read the free disk space on the host" in out and "No such file" not in out
        assert h.exec("test", "-e", home, check=False).returncode != 0      # --check made nothing
    finally:
        docker("rmi", "-f", f"{repo}:{V}", check=False)
