"""The container readiness check (``ktdeploy doctor --image IMAGE``, up's ``image.check`` step, the ansible
``ktsft_image`` role, testinfra ``--kt-image``): one implementation.

On the host behind ``connector``: gather the host's facts, ``docker run`` IMAGE with exactly the training
container's flags (``core/plan/docker_argv.image_check``, which shares ``training_flags`` with ``create_train``),
gather the same facts inside it (layer checks: AMX tile probe, ISA, shm, memlock as the container sees them,
``gpu.present`` / ``gpu.driver`` on the container's nvidia-smi), run the stack probe with the image's ``python3``
(Python.h, torch, CUDA vs the GPUs given, one Triton kernel) and, with a recipe, the stack's own judgement of it
(``stack.judge``), remove the container. Every docker call is bounded.
"""

from __future__ import annotations

import re
import secrets

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.connectors.docker_exec import DockerExecConnector
from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.controller.doctor import DoctorReport, container_checks, gather_data, run_checks
from ktdeploy.controller.facts_gather import gather_facts
from ktdeploy.controller.stack_judge_runner import stack_judge_check
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks import resources
from ktdeploy.core.checks.stack import stack_checks
from ktdeploy.core.errors import ConnectError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.facts.stack_probe import TRITON_TIMEOUT_S, parse_stack_output, probe_argv
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER
from ktdeploy.core.recipe.document import Recipe

RUN_TIMEOUT_S = 120          # docker run --detach (the image is already on the host)
PROBE_TIMEOUT_S = TRITON_TIMEOUT_S + 120   # the stack probe: torch import + CUDA init + one Triton kernel


def host_user(connector: Connector) -> str | None:
    """uid:gid of the connecting user: the training container runs as it (``create_train``'s ``user``)."""
    r = connector.run(["sh", "-c", 'printf "%s:%s" "$(id -u)" "$(id -g)"'], timeout=30)
    return r.stdout.strip() if r.rc == 0 and re.fullmatch(r"\d+:\d+", r.stdout.strip()) else None


def stack_probe_checks(connector: Connector, gpus_asked: int) -> list[CheckResult]:
    """The stack probe run through ``connector`` (inside the image's container, or where doctor itself runs:
    ``doctor --stack``) and judged: stack.probe, python_headers, torch, cuda, triton."""
    p = connector.run(probe_argv(gpus_asked), timeout=PROBE_TIMEOUT_S)
    return stack_checks(parse_stack_output(p.stdout, p.rc, p.stderr))


def _fail(name: CheckName, detail: str, fix: str) -> CheckResult:
    return CheckResult(name=name, status="fail", detail=detail, fix=fix, layer="container")


def image_doctor(connector: Connector, image: str, *, recipe: Recipe | None = None, gpus: list[int] | None = None, user: str | None = None,
                 memlock: bool = True, name: str | None = None, host_facts: HostFacts | None = None,
                 replace_stale: bool = False, judge: bool = True) -> DoctorReport:
    """doctor on the host and inside ``image`` started there with the training flags. ``gpus``: the GPUs the
    training container gets (default: the recipe's deploy.gpus, else every GPU the host has); ``user``: uid:gid
    it runs as (default: the connecting user's, as up does). Given ``host_facts`` (up's image.check, after its
    PREFLIGHT doctor): only the container's checks, against them. ``replace_stale`` (up, which holds
    the job's lock, so no other check of this job runs): a container already named ``name`` is a leftover of a
    check that was killed, and is removed first (it made the next `up` fail once, with a fix about the image).
    With a recipe (and ``judge``), the stack in the image judges it there too (``stack.judge``,
    controller/stack_judge_runner.py)."""
    host_checks = host_facts is None
    paths = list(dict.fromkeys(resources.recipe_paths(recipe).values())) if recipe is not None else []
    facts = host_facts if host_facts is not None else gather_facts(connector, paths=paths)
    dfacts = gather_data(connector, dict(recipe.train)) if recipe is not None and host_checks else None
    if gpus is None:
        deploy = getattr(recipe, "deploy", None)
        gpus = list(deploy.gpus) if deploy is not None and getattr(deploy, "gpus", None) else \
            [g.index for g in facts.gpu.gpus]
    if user is None:
        user = host_user(connector)
    name = name or f"ktdeploy-imgcheck-{secrets.token_hex(4)}"
    argv = dk.image_check(image, name=name, gpus=gpus, memlock=memlock, user=user)
    if replace_stale:
        connector.run(dk.remove(name), timeout=60)
    extra: list[CheckResult] = []
    cfacts = None
    stack: list[CheckResult] = []
    r = connector.run(argv, timeout=RUN_TIMEOUT_S)
    try:
        if r.rc != 0:
            lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()
                     and not ln.startswith("Run 'docker run --help'")]
            why = (lines[0] if lines else f"exit {r.rc}")[:600]
            fix = ("docker may not raise memlock here (rootless, or no CAP_SYS_RESOURCE): run docker with that "
                   f"capability, or --waive {MEMLOCK_WAIVER} (containers then start without --ulimit memlock=-1)."
                   if "rlimit" in why else "Check the image reference (`docker image inspect`), the NVIDIA runtime "
                                           "(docker.nvidia_runtime) and deploy.gpus.")
            extra.append(_fail(CheckName.IMAGE_RUN, f"{image} did not start with the training flags on {connector.name}: "
                                            f"{why}", fix))
        else:
            extra.append(CheckResult(name=CheckName.IMAGE_RUN, status="pass", layer="container",
                                     detail=f"{image} started with the training flags ({len(gpus)} GPU(s))",
                                     data={"argv": argv}))
            via = None if isinstance(connector, LocalConnector) else connector
            try:
                inner = DockerExecConnector(name, via=via)
            except ConnectError as e:
                extra.append(_fail(CheckName.IMAGE_RUN, f"{image} stopped right after starting: {e}",
                                   "Run it by hand: " + " ".join(argv)))
            else:
                cfacts = gather_facts(inner)
                stack = stack_probe_checks(inner, len(gpus))
                if recipe is not None and judge:
                    stack.append(stack_judge_check(inner, recipe))
    finally:
        connector.run(dk.remove(name), timeout=60)
    if host_checks:
        checks = run_checks(facts, recipe, cfacts, dfacts) + extra
    else:
        checks = (container_checks(facts, cfacts, recipe) if cfacts is not None else []) + extra
    return DoctorReport(facts, checks + stack, cfacts)
