"""The Slurm roles on real hosts, under --check on ansible-core 2.19 and 2.16: slurm_node computes the node's
slurm.conf line from doctor's report of that host (through the ktdeploy_slurm_node filter) and slurm_controller
composes slurm.conf from it; with Slurm already installed (the slurm test host image) nothing fails and the
packages report no change. The report is `ktdeploy doctor --json` run on the host (as the preflight role does)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.hosts import host_pool  # noqa: F401 (fixture)
from tests.integration.slurm_cluster import ensure_slurm_image
from tests.integration.test_ansible_fleet import recap
from tests.integration.test_ansible_rollout import ansible_bin  # noqa: F401 (fixture: 2.19 and 2.16)

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"


@pytest.fixture(scope="module")
def slurm_hosts(host_pool, tmp_path_factory):  # noqa: F811
    import sys

    tmp = tmp_path_factory.mktemp("ansible-slurm")
    image = ensure_slurm_image()
    node = host_pool.start("sl-node", image=image, hide_flags=("amx_tile", "amx_int8", "amx_bf16"))
    ctl = host_pool.start("sl-ctl", image=image)
    o = host_pool.ssh_options()
    report = subprocess.run([sys.executable, "-m", "ktdeploy", "doctor", "--host", node.target, "--json",
                             "--ssh-key", o["key"], "--known-hosts", o["known_hosts"]],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert report.stdout.startswith("{"), report.stderr
    common = f"-o UserKnownHostsFile={host_pool.known_hosts} -o StrictHostKeyChecking=yes -o ConnectTimeout=5"
    conn = {"ansible_user": "root", "ansible_ssh_private_key_file": str(host_pool.key),
            "ansible_ssh_common_args": common, "ansible_python_interpreter": "/usr/bin/python3"}
    inv = {"all": {"vars": conn, "children": {
        "slurm_nodes": {"hosts": {"sl-node": {"ansible_host": node.address, "ansible_port": node.port,
                                              "ktdeploy_gpus": [0, 1],
                                              "preflight_report": json.loads(report.stdout)}}},
        "slurm_controller": {"hosts": {"sl-ctl": {"ansible_host": ctl.address, "ansible_port": ctl.port}}}}}}
    (tmp / "inventory.yml").write_text(json.dumps(inv))
    # the roles alone (preflight, runtime and image have their own tests): node first, then the controller
    (tmp / "play.yml").write_text(json.dumps([
        {"name": "Slurm node", "hosts": "slurm_nodes", "gather_facts": False,
         "roles": [{"role": "slurm_node"}]},
        {"name": "Slurm controller", "hosts": "slurm_controller", "gather_facts": False,
         "roles": [{"role": "slurm_controller"}],
         "post_tasks": [{"name": "Show slurm.conf", "ansible.builtin.debug": {"var": "slurm_controller_conf_text"}}]},
    ]))
    return tmp


def test_slurm_roles_check_mode(slurm_hosts, ansible_bin):  # noqa: F811
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_ROLES_PATH=str(ANSIBLE / "roles"), ANSIBLE_FILTER_PLUGINS=str(ANSIBLE / "filter_plugins"),
               PATH=f"{ansible_bin}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([str(ansible_bin / "ansible-playbook"), "-i", str(slurm_hosts / "inventory.yml"),
                        str(slurm_hosts / "play.yml"), "--check", "--diff"], cwd=ANSIBLE, env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    rc = recap(out)
    assert rc["sl-node"]["failed"] == 0 and rc["sl-ctl"]["failed"] == 0, out[-3000:]
    # the node line is ktdeploy's, from that host's doctor report: AMX hidden there, 2 GPUs from ktdeploy_gpus
    assert "NodeName=sl-node " in out and "Gres=gpu:2" in out and "Features=avx2" in out, out[-3000:]
    assert "amx" not in out.split("NodeName=sl-node", 1)[1].split("\\n", 1)[0]
    assert "Name=gpu File=/dev/nvidia[0-1]" in out                     # gres.conf's diff
