"""`ktdeploy doctor`: ``doctor(DoctorRequest)`` — the host's facts and every check (with a recipe, its checks too),
where the request says: on the host, in an image's training container (``image``), against a running container
(``container``), with the stack probe (``stack``) or a kt-kernel build (``variant``). Bad arguments are a
UsageError before anything is reached; the checks themselves are controller/doctor.py's."""

from __future__ import annotations

from ktdeploy.controller.connectors import Connector, DockerExecConnector, connect
from ktdeploy.controller.doctor import DoctorReport
from ktdeploy.controller.doctor import doctor as run_doctor
from ktdeploy.controller.image_check import image_doctor, stack_probe_checks
from ktdeploy.controller.local_host import local_raw
from ktdeploy.controller.stack_judge_runner import stack_judge_check
from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.checks.gate import with_profile
from ktdeploy.core.checks.isa import variant_check
from ktdeploy.core.command_requests import DoctorRequest
from ktdeploy.core.errors import UsageError
from ktdeploy.core.host_target import HostTarget, parse_host
from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.recipe.document import Recipe


def _gpu_list(request: DoctorRequest, image: str | None) -> list[int] | None:
    if request.gpus is None:
        return None
    if not image:
        raise UsageError("--gpus is the GPUs the --image container gets", fix="Pass --image IMAGE with it.")
    try:
        return [int(g) for g in request.gpus.split(",") if g.strip()]
    except ValueError:
        raise UsageError(f"--gpus {request.gpus!r} is not a list of GPU indices", fix="e.g. --gpus 0,1") from None


def _image_and_variant(request: DoctorRequest) -> tuple[str | None, str | None]:
    image, variant = request.image, request.variant
    if image is not None and V.known(image):   # the former meaning of --image: an ISA variant
        variant, image = variant or image, None
    if variant is not None and not V.known(variant):
        from ktdeploy.core.recipe.catalog import did_you_mean

        near = did_you_mean(variant, V.NAMES, cutoff=0.6)
        raise UsageError(f"--variant {variant!r} is not a kt-kernel build" + (f" (did you mean {near}?)" if near else ""),
                         key="--variant", fix=f"Use one of {', '.join(V.NAMES)}.")
    if image and request.container:
        raise UsageError("--image and --container both name the container to check",
                         fix="Pass --image IMAGE (started for the check) or --container NAME (already running).")
    return image, variant


def doctor(request: DoctorRequest) -> DoctorReport:
    """The report's ``waived`` holds the request's waivers (+ the --cpu-only profile)."""
    rec = None
    if request.recipe is not None:
        rec = load_recipe(request.recipe, list(request.overrides))
    elif request.overrides:
        raise UsageError("--set needs --recipe", fix="Pass the recipe the overrides apply to: --recipe FILE --set ...")
    image, variant = _image_and_variant(request)
    gpu_list = _gpu_list(request, image)
    target = parse_host(request.host)   # a password in ssh://user:PW@host is never used, shown or recorded
    conn = connect(target, **(request.ssh.connect_kwargs() if target.kind == "ssh" else {}))
    try:
        if image:
            report = image_doctor(conn, image, recipe=rec, gpus=gpu_list, memlock=MEMLOCK_WAIVER not in request.waive)
        else:
            report = _host_report(conn, target, rec, request.container)
            if request.stack:   # --image already ran it inside the container
                _add_stack_checks(conn, report, rec)
        if variant:
            vc = variant_check(report.facts, variant)
            vc.name, vc.layer = CheckName.IMAGE_VARIANT, report.facts.layer
            report.checks.append(vc)
    finally:
        conn.close()
    report.waived = with_profile(request.waive, request.cpu_only)
    return report


def _host_report(conn: Connector, target: HostTarget, rec: Recipe | None, container: str | None) -> DoctorReport:
    inner = DockerExecConnector(container, via=None if target.is_local else conn) if container else None
    # this host: the facts the image's entrypoint already gathered for its ISA gate (gathered here otherwise)
    return run_doctor(conn, rec, container=inner, host_raw=local_raw() if target.is_local else None)


def _add_stack_checks(conn: Connector, report: DoctorReport, rec: Recipe | None) -> None:
    """--stack: the stack probe where doctor runs, and (with a recipe) the stack's judgement of it (stack.judge)."""
    checks = stack_probe_checks(conn, report.facts.gpu.count)
    if rec is not None:
        checks.append(stack_judge_check(conn, rec, in_container=False))
    for c in checks:
        c.layer = report.facts.layer
        report.checks.append(c)
