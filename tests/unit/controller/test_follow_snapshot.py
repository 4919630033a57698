"""How FOLLOW tells a lost connection from a removed container, driven by recorded answers of FOLLOW_SCRIPT.

The answers below were recorded on this machine (`sh -c FOLLOW_SCRIPT x NAME LOG` against the docker engine) and
over SSH when the per-connection sshd was killed mid-command: paramiko then closes the channel with no exit status
(rc -1) and whatever output had arrived. Only a complete answer whose docker inspect said "No such container"
may read as "the container is gone"; everything else is a lost connection (ConnectError, exit 3)."""

import pytest

from ktdeploy.controller.connectors.base import Result
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import FOLLOW_SCRIPT, Executor, parse_snapshot, snapshot
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core.errors import ConnectError, StepError
from ktdeploy.core.plan.params import FollowParams
from ktdeploy.core.plan.steps import Plan, Stage, Step
from tests.fakes.connector import FakeConnector, ok

RUNNING = ('@@inspect\t0\n{"Status":"running","Running":true,"Paused":false,"Restarting":false,"OOMKilled":false,'
           '"Dead":false,"Pid":1936,"ExitCode":0,"Error":"","StartedAt":"2026-12-03T07:01:14.592389364Z",'
           '"FinishedAt":"0001-01-01T00:00:00Z"}\n@@log\n'
           '{"current_steps": 4, "total_steps": 40, "loss": 2.1, "percentage": 10.0}\n'
           '{"current_steps": 6, "total_steps": 40, "loss": 2.0, "percentage": 15.0}\n@@end\n')
EXITED = RUNNING.replace('"Status":"running","Running":true', '"Status":"exited","Running":false')
NO_SUCH = '@@inspect\t1\n\nError response from daemon: No such container: e2e-follow-nope\n@@log\n@@end\n'
DAEMON_DOWN = ('@@inspect\t1\n\nCannot connect to the Docker daemon at unix:///nonexistent.sock. '
               'Is the docker daemon running?\n@@log\n@@end\n')

# the connection dropped: (rc, stdout, stderr) as the SSH connector handed them back before the fix
LOST = [
    (-1, "", ""),                                             # killed before any output
    (-1, "@@inspect\t0\n", ""),                               # killed after the first line
    (-1, RUNNING.split("@@log")[0], ""),                      # killed after the state, before the log tail
    (-1, RUNNING.replace("@@end\n", ""), ""),                 # killed just before the end marker
    (255, "", "ssh: connect to host gpu01 port 22: Connection refused"),  # an ssh(1) client's exit code
    (124, "", "\ntimed out after 5.0s"),                      # the host fell silent
    (0, "", ""),                                              # empty answer (the old script's "|| echo" path)
    (0, "@@inspect\t1\n\n@@log\n", ""),                       # cut short: no end marker, no docker message
]


@pytest.mark.parametrize("rc,out,err", LOST)
def test_a_cut_short_or_failed_answer_is_a_lost_connection(rc, out, err):
    with pytest.raises(ConnectError) as ei:
        parse_snapshot(rc, out, err, host="ssh://gpu01:22", timeout=5)
    assert "keeps running" in ei.value.fix and "re-run `ktdeploy up`" in ei.value.fix


def test_only_a_positive_no_such_container_means_gone():
    snap = parse_snapshot(0, NO_SUCH)
    assert snap.state is None and snap.entry is None


def test_docker_unable_to_answer_is_not_gone():
    with pytest.raises(ConnectError) as ei:
        parse_snapshot(0, DAEMON_DOWN, host="ssh://gpu01:22")
    assert "Cannot connect to the Docker daemon" in ei.value.message


def test_running_and_exited_states_and_the_log_tail():
    snap = parse_snapshot(0, RUNNING)
    assert snap.state.running and snap.entry.current_steps == 6
    snap = parse_snapshot(0, EXITED)
    assert not snap.state.running and snap.state.succeeded


def recorded(answers: list[Result]) -> FakeConnector:
    """A host that gives FOLLOW_SCRIPT's recorded answers in turn (the host side is what is recorded, not what is
    asserted)."""
    return FakeConnector(name="ssh://gpu01:22").on(("sh", "-c", FOLLOW_SCRIPT), answers).on(("docker", "logs"), ok())


def _follow_plan():
    step = Step("train.follow", "follow training", action="follow",
                params=FollowParams(container="job", log="/out/trainer_log.jsonl"))
    return Plan(host="gpu01", recipe="tiny", job="job", image="img", variant=None, output_dir="/out",
                adapter_dir="/out/a", job_dir="/job", stages=(Stage("FOLLOW", "follow", (step,)),))


@pytest.mark.parametrize("rc,out,err", LOST)
def test_follow_reports_a_dropped_connection_as_lost_not_removed(tmp_path, rc, out, err):
    rec = RunRecord.create("tiny", root=tmp_path)
    ex = Executor(recorded([Result(0, RUNNING, ""), Result(rc, out, err)]), Emitter(rec), _follow_plan(), poll_s=0)
    with pytest.raises(ConnectError):
        ex.apply()
    assert not any(e["event"] == "crash" for e in rec.events())


def test_follow_reports_a_removed_container_as_removed(tmp_path):
    rec = RunRecord.create("tiny", root=tmp_path)
    ex = Executor(recorded([Result(0, RUNNING, ""), Result(0, NO_SUCH, "")]), Emitter(rec), _follow_plan(), poll_s=0)
    with pytest.raises(StepError) as ei:
        ex.apply()
    assert "disappeared" in ei.value.message and ei.value.exit_code == 4


def test_snapshot_passes_the_connectors_answer_through():
    assert snapshot(recorded([Result(0, RUNNING, "")]), "job", "/out/trainer_log.jsonl").state.running
