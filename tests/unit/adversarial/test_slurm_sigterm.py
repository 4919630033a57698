"""SIGTERM during `up-slurm` (Probe 3's F18): the jobs this run submitted are cancelled (scancel), the record says
"stopped", and the CLI exits 143."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.adversarial.harness import invoke, problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


# -- F18: SIGTERM during up-slurm ----------------------------------------------------------------------------------
def test_f18_sigterm_while_following_cancels_the_jobs_it_submitted(tmp_path, monkeypatch):
    import json as _json

    from ktdeploy.controller.runs import latest_run
    from ktdeploy.controller.up_slurm import up_slurm
    from ktdeploy.core import markers
    from ktdeploy.core.command_requests import SlurmUpRequest
    from ktdeploy.core.errors import Terminated
    from ktdeploy.core.sched.cluster import PROBE_SH
    from tests.fakes.connector import FakeConnector, ok
    from tests.fakes.slurm_probe import probe_answer

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    ids = iter(["101", "102"])

    def sigterm(argv):
        raise Terminated()

    conn = (FakeConnector(name="login01")
            .on(["sinfo"], ok("n1|avx2,avx512_base,avx512_vnni,avx512_vbmi,avx512_bf16,amx|900000|gpu:1|64|idle|100\n"))
            .on(["squeue"], ok(""))
            .on(["sbatch"], lambda argv: ok(next(ids) + "\n"))
            .on(["scancel"], ok(""))
            .on(lambda argv: argv[:2] == ["sh", "-c"] and argv[2] == PROBE_SH, ok(probe_answer(tmp_path)))
            .on(lambda argv: argv[:3] == ["sh", "-c", markers.JOB_SH], sigterm)
            .on(lambda argv: True, ok("")))
    with pytest.raises(Terminated):
        up_slurm(SlurmUpRequest(login="login01", recipe=str(TINY),
                                overrides=("deploy.scheduler.cpus=4", "deploy.image=amx")), connector=conn)
    cancelled = [c.argv for c in conn.calls if c.argv[:1] == ["scancel"]]
    assert sorted(cancelled) == [["scancel", "--", "101"], ["scancel", "--", "102"]], cancelled
    st = latest_run().status()
    assert st["state"] == "stopped" and "SIGTERM" in st["note"] and st["slurm_jobs"] == {"train": "101",
                                                                                         "convert": "102"}
    assert _json.dumps(st["down"])


@pytest.mark.parametrize("argv", [["up-slurm", "login01"], ["up", "--slurm", "login01"]],
                         ids=["up-slurm", "the former up --slurm"])
def test_f18_the_cli_maps_sigterm_of_up_slurm_to_143(tmp_path, monkeypatch, argv):
    from ktdeploy.controller import up_slurm
    from ktdeploy.core.errors import Terminated

    def terminated(*a, **k):
        raise Terminated()

    monkeypatch.setattr(up_slurm, "up_slurm", terminated)
    rc, out, _ = invoke([*argv, str(TINY)], cwd=tmp_path)
    assert rc == 143 and not problems(rc, out), out
