"""Parser edge cases, on small inputs in each tool's documented format (whole-machine outputs are golden files)."""

import json

from hypothesis import given
from hypothesis import strategies as st

from ktdeploy.controller.facts_gather import gather_script, parse_sections
from ktdeploy.core.facts.container import build_container
from ktdeploy.core.facts.cpu import build_cpu, parse_cpu_list, parse_lscpu_json
from ktdeploy.core.facts.docker import build_docker
from ktdeploy.core.facts.gpu import build_gpu, parse_nvidia_smi
from ktdeploy.core.facts.kernel import parse_kernel_release
from ktdeploy.core.facts.limits import parse_cgroup, parse_df_line, parse_proc_limits
from ktdeploy.core.facts.sources import FactCommand
from ktdeploy.core.facts.virt import build_virt


@given(st.sets(st.integers(0, 511), min_size=1))
def test_cpu_list_round_trip(cpus):
    s = sorted(cpus)
    ranges, start, prev = [], s[0], s[0]
    for c in s[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        ranges.append(f"{start}-{prev}" if prev > start else str(start))
        if c is not None:
            start = prev = c
    assert parse_cpu_list(",".join(ranges)) == s


def test_lscpu_json_nested_children():
    doc = {"lscpu": [{"field": "Architecture:", "data": "x86_64", "children": [
        {"field": "CPU(s):", "data": "8"}]},
        {"field": "Socket(s):", "data": "2"}, {"field": "Core(s) per socket:", "data": "2"},
        {"field": "Thread(s) per core:", "data": "2"},
        {"field": "NUMA:", "data": None, "children": [
            {"field": "NUMA node(s):", "data": "2"},
            {"field": "NUMA node0 CPU(s):", "data": "0-3"}, {"field": "NUMA node1 CPU(s):", "data": "4-7"}]}]}
    out = parse_lscpu_json(json.dumps(doc))
    assert out["sockets"] == 2 and out["logical_cpus"] == 8 and out["threads_per_core"] == 2
    assert [(n.id, n.cpus) for n in out["numa_nodes"]] == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]
    cpu = build_cpu(None, json.dumps(doc))
    assert cpu.physical_cores == 4  # no per-CPU core map: logical / threads_per_core


def test_nvidia_smi_rows_and_failures():
    rows = parse_nvidia_smi("0, NVIDIA H200, 143771, 0, 570.86.15, GPU-aaaa\n"
                            "1, NVIDIA H200, 143771, [N/A], 570.86.15, GPU-bbbb\n")
    assert [(g.index, g.memory_total_mib, g.memory_used_mib) for g in rows] == [(0, 143771, 0), (1, 143771, None)]
    failed = build_gpu("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9)
    assert failed.nvidia_smi == "failed" and "couldn't communicate" in failed.error
    assert build_gpu("", 127, devices="/dev/nvidia0\n/dev/nvidiactl\n").device_nodes == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_docker_info_states():
    down = build_docker('{"ServerErrors":["Cannot connect to the Docker daemon at unix:///var/run/docker.sock."]}',
                        1)
    assert down.present and not down.reachable and "Cannot connect" in down.error
    up = build_docker(json.dumps({"ServerVersion": "27.3.1", "Runtimes": {"runc": {}, "nvidia": {}},
                                  "DefaultRuntime": "runc", "CgroupVersion": "2"}), 0)
    assert up.reachable and up.nvidia_runtime and up.cgroup_version == "2"
    assert build_docker("", 127).present is False
    denied = build_docker("", 1, "permission denied while trying to connect to the Docker daemon socket")
    assert not denied.reachable and "permission denied" in denied.error


def test_cgroup_v1_v2_limits():
    assert parse_cgroup("version=v2\nmemory=max\ncpu=max 100000") == {"version": "v2", "memory_limit": "unlimited",
                                                                        "cpu_quota": None}
    assert parse_cgroup("version=v2\nmemory=2147483648\ncpu=150000 100000")["cpu_quota"] == 1.5
    assert parse_cgroup("version=v1\nmemory=9223372036854771712\ncpu=-1 100000")["memory_limit"] == "unlimited"


def test_proc_limits_and_df():
    text = ("Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max locked memory         unlimited            unlimited            bytes     \n")
    assert parse_proc_limits(text)["Max locked memory"] == ("unlimited", "unlimited")
    df = parse_df_line("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                       "/dev/nvme0n1p2 1000 10 990 1% /data/my models\n")
    assert df == {"filesystem": "/dev/nvme0n1p2", "total_bytes": 1024000, "free_bytes": 1013760,
                  "mount": "/data/my models"}


def test_kernel_release():
    assert parse_kernel_release("5.15.0-1051-azure") == (5, 15, 0)
    assert parse_kernel_release("6.1.0-18-amd64") == (6, 1, 0)
    assert parse_kernel_release("garbage") is None


def test_container_and_virt_detection():
    k8s = build_container("", 127, "", "0::/kubepods/besteffort/pod1234/abcd\n", "")
    assert k8s.in_container and k8s.kind == "kubernetes"
    bare = build_container("none", 1, "", "0::/init.scope\n", "22 1 8:2 / / rw - ext4 /dev/sda2 rw")
    assert not bare.in_container
    v = build_virt(True, "", 127, "sys_vendor=Amazon EC2\nproduct_name=m7i.48xlarge\n")
    assert v.vm == "amazon" and v.is_vm
    metal = build_virt(False, "none", 1, "sys_vendor=Supermicro\nproduct_name=SYS-221H\n")
    assert metal.vm == "none" and not metal.is_vm


def test_gather_script_sections_round_trip(tmp_path):
    import subprocess

    script = gather_script([FactCommand("a", "printf 'x\\ny'"), FactCommand("b", "echo oops >&2; exit 3"),
                            FactCommand("c", "printf ''")])
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    s = parse_sections(out)
    assert (s["a"].stdout, s["a"].rc) == ("x\ny", 0)
    assert (s["b"].rc, s["b"].stderr) == (3, "oops")
    assert s["c"].stdout == "" and s["c"].rc == 0
