"""The serve stage: the API key travels as a 0600 file read once by `docker create --env-file`, never as an argv
item or in the plan; readiness is an HTTP /health probe, not just 'the container is still running'."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.core.errors import StepError
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.params import SecretParams
from ktdeploy.core.plan.steps import Stage, Step
from tests.unit.core.plan.test_host_plan import facts, recipe, state, steps

SECRET = "sk-test-0123456789"


def test_api_key_goes_through_an_env_file_and_never_into_the_plan():
    p = build_plan(recipe("deploy.serve.api_key_env=KTDEPLOY_API_KEY"), facts(), state(), UpOptions(host="gpu01", run_id="r"))
    st = steps(p)
    key = st["serve.key"]
    assert key.action == "put_secret" and key.params == SecretParams(env="KTDEPLOY_API_KEY")
    create = st["serve.create"].argv
    assert create[create.index("--env-file") + 1] == key.remote
    assert st["serve.unstage_key"].argv == ("rm", "-f", "--", key.remote)
    ids = [s.id for _, s in p.steps()]
    assert ids.index("serve.key") < ids.index("serve.create") < ids.index("serve.unstage_key") < ids.index("serve.start")
    os.environ["KTDEPLOY_API_KEY"] = SECRET
    try:  # even with the key in the environment, planning never reads it
        p2 = build_plan(recipe("deploy.serve.api_key_env=KTDEPLOY_API_KEY"), facts(), state(), UpOptions(host="g", run_id="r"))
        assert SECRET not in json.dumps(p2.to_json())
    finally:
        del os.environ["KTDEPLOY_API_KEY"]


def test_without_api_key_no_env_file():
    p = build_plan(recipe(), facts(), state(), UpOptions(host="gpu01", run_id="r"))
    st = steps(p)
    assert "serve.key" not in st and "--env-file" not in st["serve.create"].argv
    ready = st["serve.ready"]
    assert ready.action == "wait_http" and ready.argv[:3] == ("docker", "exec", st["serve.create"].argv[3])
    assert ready.timeout == 1800


class _Exec:
    """The executor's put_secret / wait_http handlers over the real local connector."""

    def __init__(self):
        from ktdeploy.controller.executor import Executor

        self.ex = Executor.__new__(Executor)
        self.ex.conn = LocalConnector()
        self.ex.emit = lambda _event: None


def test_put_secret_writes_a_0600_file_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_API_KEY", SECRET)
    target = tmp_path / "job" / "serve.env"
    _Exec().ex._do_put_secret(Stage("SERVE", "serve", ()), Step("serve.key", "key", action="put_secret",
                                                                  remote=str(target), params=SecretParams(env="KTDEPLOY_API_KEY")))
    assert target.read_text() == f"KTDEPLOY_API_KEY={SECRET}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_put_secret_without_the_variable_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.delenv("KTDEPLOY_API_KEY", raising=False)
    with pytest.raises(StepError, match="KTDEPLOY_API_KEY") as ei:
        _Exec().ex._do_put_secret(Stage("SERVE", "serve", ()), Step("serve.key", "key", action="put_secret",
                                                                      remote=str(tmp_path / "k"),
                                                                      params=SecretParams(env="KTDEPLOY_API_KEY")))
    assert "export KTDEPLOY_API_KEY" in ei.value.fix
    assert not (tmp_path / "k").exists()


def test_health_probe_script_answers_only_when_the_server_does():
    from ktdeploy.core.plan.docker_argv import HEALTH_SCRIPT

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert subprocess.run([sys.executable, "-c", HEALTH_SCRIPT, str(port)]).returncode == 0
    finally:
        srv.shutdown()
        srv.server_close()
    assert subprocess.run([sys.executable, "-c", HEALTH_SCRIPT, str(port)], capture_output=True).returncode != 0


def test_a_server_bound_to_one_address_is_asked_there():
    from ktdeploy.core.plan.docker_argv import HEALTH_AT_SCRIPT

    p = build_plan(recipe("deploy.serve.host=10.9.8.7"), facts(), state(), UpOptions(host="gpu01", run_id="r"))
    ready = steps(p)["serve.ready"].argv
    assert ready[-4:] == ("-c", HEALTH_AT_SCRIPT, "30000", "10.9.8.7")
    for every in ("0.0.0.0", "127.0.0.1"):
        assert steps(build_plan(recipe(f"deploy.serve.host={every}"), facts(), state(),
                                UpOptions(host="g", run_id="r")))["serve.ready"].argv[-1] == "30000"

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.2", 0), H)   # one address of the loopback range, not 127.0.0.1
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert subprocess.run([sys.executable, "-c", HEALTH_AT_SCRIPT, str(port), "127.0.0.2"]).returncode == 0
    finally:
        srv.shutdown()
        srv.server_close()


def test_up_refuses_before_anything_when_the_key_variable_is_missing(monkeypatch):
    from ktdeploy.controller import up_record
    from ktdeploy.controller.up_host import up
    from ktdeploy.core.command_requests import UpRequest
    from ktdeploy.core.errors import UsageError
    from ktdeploy.core.recipe import builtin_recipe

    monkeypatch.delenv("KTDEPLOY_API_KEY", raising=False)
    monkeypatch.setattr(up_record, "RunRecord", None)  # nothing may be recorded or started before the refusal
    with pytest.raises(UsageError, match="KTDEPLOY_API_KEY"):
        up(UpRequest(host="gpu01", recipe=str(builtin_recipe()), overrides=("deploy.serve.api_key_env=KTDEPLOY_API_KEY",)))
