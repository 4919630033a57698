"""doctor: every check, in one place, for every front door (CLI, image agent, up, ansible, testinfra).

``run_checks(facts, recipe=None, container_facts=None)`` is pure. ``doctor(connector, recipe=None,
container=None)`` gathers the facts through connectors and runs it.

JSON (``DoctorReport.to_json()``, schema_version 1; fields are only added within a version)::

    {"schema_version": 1, "host": str, "ok": bool,
     "summary": {"pass": n, "warn": n, "fail": n, "skip": n, "waived": n, "deferred": n},
     (fail = failing and not waived: the count every front door prints, DoctorReport.summary())
     "facts": HostFacts, "container_facts": HostFacts | null,
     "checks": [{"name", "status": "pass|warn|fail|skip", "detail", "fix", "layer", "data"}]}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.facts_gather import gather_facts
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks import amx, data, isa, layers, resources, threads
from ktdeploy.core.checks.gate import gate
from ktdeploy.core.checks.readable import readable_checks
from ktdeploy.core.checks.resources import Requirements
from ktdeploy.core.facts.assemble import RawFacts
from ktdeploy.core.facts.data_listing import DataFacts
from ktdeploy.core.facts.host import SCHEMA_VERSION, HostFacts
from ktdeploy.core.facts.sources import DATA
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sizing.checks import plan_check_results  # plan.host_memory / plan.gpu_memory / plan.disk


def _runtime_checks(facts: HostFacts, recipe: Recipe | None = None, req: Requirements | None = None) -> list[CheckResult]:
    """Checks about where training runs (the host itself, or the training container)."""
    out: list[CheckResult] = [amx.kernel_check(facts)]
    out += isa.isa_checks(facts)
    out += amx.amx_checks(facts)
    if recipe is not None:
        fmt, backend = resources.recipe_weight_format(recipe)
        if fmt in isa.WEIGHT_FORMATS:
            out.append(isa.weight_format_check(facts, fmt, backend))
        deploy = getattr(recipe, "deploy", None)
        variant = deploy.variant() if deploy is not None and hasattr(deploy, "variant") else None
        if variant:
            vc = isa.variant_check(facts, variant)
            vc.name = CheckName.RECIPE_IMAGE_VARIANT
            out.append(vc)
    out.append(threads.mempolicy_check(facts))
    reserve = getattr(getattr(recipe, "deploy", None), "reserve_cores", 2)
    out.append(threads.threads_check(facts, reserve, getattr(recipe, "train", None)))
    out.append(resources.gpu_present_check(facts))
    out.append(resources.gpu_driver_check(facts))
    for r in out:
        r.layer = r.layer or facts.layer
    if recipe is not None and getattr(recipe, "deploy", None) is not None and req is not None:
        out += resources.gpu_recipe_checks(facts, recipe, req)
    out += resources.memory_checks(facts, req)
    return out


def _requirements(facts: HostFacts, recipe: Recipe | None, planned: Any = ...) -> Requirements | None:
    req = resources.recipe_requirements(recipe, facts, planned) if recipe is not None else None
    if req is not None and str(req.basis.get("host_memory", "")).startswith("planner"):
        # plan.host_memory / plan.gpu_memory / plan.disk gate on the planner's figures (with the knob that brings a
        # shortfall under); the capacity checks then only report capacity, so one shortfall fails once.
        req = dataclasses.replace(req, host_memory_bytes=None, gpu_memory_mib=None, output_disk_bytes=None)
    return req


def container_checks(facts: HostFacts, container_facts: HostFacts, recipe: Recipe | None = None,
                     req: Requirements | None = None) -> list[CheckResult]:
    """Pure: the runtime checks on the training container's facts (layer "container") and the layer comparison
    with its host's."""
    inner = _runtime_checks(container_facts, recipe, req if req is not None else _requirements(facts, recipe))
    inner += readable_checks(container_facts)
    for r in inner:
        r.layer = "container"
    return inner + layers.layer_checks(facts, container_facts)


def _image_for(recipe: Recipe, facts: HostFacts) -> str | None:
    """The image this host's run would use, for fixes that name a `docker run` (None: not resolvable here)."""
    from ktdeploy.core.errors import UsageError
    from ktdeploy.core.plan.host_plan import resolve_image

    if recipe.deploy is None:
        return None
    try:
        return resolve_image(recipe.deploy, facts)[0]
    except UsageError:
        return None


def run_checks(facts: HostFacts, recipe: Recipe | None = None, container_facts: HostFacts | None = None,
               data_facts: DataFacts | None = None) -> list[CheckResult]:
    """Pure: every check on the host facts (+ the container's and the layer comparison, + the recipe's data and
    weights when given)."""
    planned = resources.recipe_plan(recipe) if recipe is not None else None   # the planner runs once per doctor run
    req = _requirements(facts, recipe, planned)
    out = _runtime_checks(facts, recipe, req)
    out += readable_checks(facts)
    out += resources.docker_checks(facts)
    if recipe is not None and req is not None:
        out += resources.path_checks(facts, recipe, req)
    if recipe is not None:
        out += plan_check_results(recipe, facts, planned=planned)
    if container_facts is not None:
        out += container_checks(facts, container_facts, recipe, req)
    if recipe is not None and data_facts is not None:
        for r in data.data_checks(dict(recipe.train), recipe.weight_setup(), data_facts, _image_for(recipe, facts)):
            r.layer = r.layer or facts.layer
            out.append(r)
    return out


def gather_data(connector: Connector, train: dict[str, Any]) -> DataFacts:
    """Two bounded reads through ``connector``: dataset_info/config/weights listing, then the dataset files."""
    facts = DataFacts()
    for first_round in (True, False):
        reqs = data.data_requests(train) if first_round else data.file_requests(train, facts)
        if not reqs:
            continue
        res = connector.run(DATA.argv([x for pair in reqs for x in pair]), timeout=DATA.timeout_s)
        facts.entries.update(DATA.parse(res.stdout).entries)
    return facts


@dataclass
class DoctorReport:
    facts: HostFacts
    checks: list[CheckResult]
    container_facts: HostFacts | None = None
    waived: tuple[str, ...] = ()   # failing checks the user explicitly accepted (e.g. gpu.present on a CPU-only box)

    @property
    def failed(self) -> list[CheckResult]:
        return gate(self.checks, self.waived).blocking

    @property
    def waived_failures(self) -> list[CheckResult]:
        return gate(self.checks, self.waived).waived

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self, deferred: Iterable[str] = ()) -> dict[str, int]:
        """The one count every front door prints: a waived failure counts as "waived", not "fail"; ``deferred``
        (check names a later stage repairs, e.g. up's RUNTIME) are counted within "fail" and also on their own."""
        s = {"pass": 0, "warn": 0, "fail": 0, "skip": 0, "waived": 0, "deferred": 0}
        for c in self.checks:
            if c.status == "fail" and c.name in self.waived:
                s["waived"] += 1
                continue
            s[c.status] += 1
            if c.status == "fail" and c.name in deferred:
                s["deferred"] += 1
        return s

    def summary_text(self, deferred: Iterable[str] = (), deferred_to: str = "the RUNTIME stage") -> str:
        """'11 pass, 4 warn, 5 fail (1 waived; 1 left to the RUNTIME stage), 5 skip' from summary()."""
        s = self.summary(deferred)
        notes = ([f"{s['waived']} waived"] if s["waived"] else []) + \
                ([f"{s['deferred']} left to {deferred_to}"] if s["deferred"] else [])
        return (f"{s['pass']} pass, {s['warn']} warn, {s['fail']} fail" + (f" ({'; '.join(notes)})" if notes else "")
                + f", {s['skip']} skip")

    def check(self, name: str, layer: str | None = None) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name and (layer is None or c.layer == layer)), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "host": self.facts.host,
            "ok": self.ok,
            "summary": self.summary(),
            "waived": list(self.waived),
            # failing checks that count (waived ones left out): what a caller (ansible, testinfra) fails on
            "failed": [c.name for c in self.failed],
            "facts": self.facts.model_dump(mode="json"),
            "container_facts": self.container_facts.model_dump(mode="json") if self.container_facts else None,
            "checks": [c.model_dump(mode="json") for c in self.checks],
        }


def doctor(connector: Connector, recipe: Recipe | None = None, container: Connector | None = None, *,
           host_raw: RawFacts | None = None) -> DoctorReport:
    """Gather facts through ``connector`` (and ``container``, a connector into the training container) and check.
    ``host_raw``: the host's raw facts already gathered by this process (reused; only the recipe's paths and data
    are looked at)."""
    paths = list(resources.recipe_paths(recipe).values()) if recipe is not None else []
    facts = gather_facts(connector, paths=list(dict.fromkeys(paths)), base=host_raw)
    cfacts = gather_facts(container) if container is not None else None
    dfacts = gather_data(connector, dict(recipe.train)) if recipe is not None else None
    return DoctorReport(facts, run_checks(facts, recipe, cfacts, dfacts), cfacts)
