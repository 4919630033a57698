"""The planner's calibration points, the fit of its measured constants, and the error band each setting's figures
carry (pure but for reading the packaged points file).

Points: the cookbook anchors (``anchors.ANCHORS``) and the GPU machine's runs (``data/gpu_peaks.json``, which
``bench/results/gpu_peaks.json`` links to; bench/gpu/weight_scale.py and vocab_scale.py append to it).

``fit_constants`` derives every constant of ``estimate.MEASURED`` from points (estimate.py holds the values the
fit gives on all committed points; tests/unit/core/sizing/test_estimate.py keeps them equal). The band of a setting
(single-GPU or multi-GPU) and resource (host or gpu) is the largest |leave-one-out residual| among that setting's
points: each point predicted by constants fitted without it. A point no constant depends on keeps its in-sample
residual; the cookbook row, the only multi-GPU point and the one the two slack constants are fitted to, is then
predicted without them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.sizing.anchors import ANCHORS
from ktdeploy.core.sizing.estimate import MEASURED, Measured, ResourcePlan, estimate
from ktdeploy.core.sizing.model_config import MoEArchitecture, parse_model_config

PEAKS_FILE = Path(__file__).with_name("data") / "gpu_peaks.json"
FITTED_CONSTANTS = ("host_slack_per_expert_gib", "gpu_slack_fraction")   # one-point fits to the published anchors
RESOURCES = ("host", "gpu")


@dataclass(frozen=True)
class Point:
    name: str
    arch: MoEArchitecture
    train: dict[str, Any]
    accelerate: dict[str, Any]
    host_gib: float | None
    gpu_gib: float | None          # nvidia-smi memory.used above idle where measured (includes the CUDA context)
    source: str
    fitted: bool                   # a published anchor: the constants in FITTED_CONSTANTS are fitted to it
    gpu_reserved_gib: float | None = None   # torch.cuda.max_memory_reserved, where the run recorded it
    pre_weights_gib: float | None = None    # host RSS before the weights load (the tokenization phase), if known

    @property
    def num_processes(self) -> int:
        return int(self.accelerate.get("num_processes") or 1)

    def measured(self, resource: str) -> float | None:
        return self.host_gib if resource == "host" else self.gpu_gib


def setting(num_processes: int) -> str:
    return "multi-GPU" if (num_processes or 1) > 1 else "single-GPU"


def gpu_peak_points(data: dict[str, Any]) -> list[Point]:
    """The GPU machine's runs from a gpu_peaks.json document."""
    out = []
    for r in data.get("runs", []):
        acc = dict(r.get("accelerate") or {})
        if r.get("num_processes"):
            acc["num_processes"] = r["num_processes"]
        out.append(Point(name=r["name"], arch=parse_model_config(r["model_config"], source=r["name"]),
                         train=dict(r.get("train") or {}), accelerate=acc,
                         host_gib=r.get("peak_host_rss_gib"),
                         gpu_gib=r.get("peak_gpu_used_gib_nvsmi", r.get("peak_gpu_mem_gib")),
                         source=str(r.get("source") or "bench/results/gpu_peaks.json"), fitted=False,
                         gpu_reserved_gib=r.get("peak_gpu_reserved_gib"),
                         pre_weights_gib=r.get("pre_weights_peak_gib")))
    return out


def calibration_points(peaks_file: Path = PEAKS_FILE) -> list[Point]:
    pts = [Point(name=a.name, arch=a.arch(), train=a.train, accelerate=a.accelerate, host_gib=a.peak_host_rss_gib,
                 gpu_gib=a.peak_gpu_mem_gib, source=a.source, fitted=True) for a in ANCHORS]
    if peaks_file.is_file():
        pts += gpu_peak_points(json.loads(peaks_file.read_text()))
    return pts


# ---------------------------------------------------------------- the fit

def _plan(p: Point, consts: dict[str, Measured]) -> ResourcePlan:
    return estimate((p.train, p.accelerate), p.arch, constants=consts)


def _minimax_shift(base: list[float], measured: list[float]) -> float:
    """The additive c >= 0 that minimises max |(base_i + c - m_i) / m_i|. Every error rises with c, so the optimum
    is where the largest error equals minus the smallest: bisection on their sum."""
    def tilt(c: float) -> float:
        errs = [(b + c - m) / m for b, m in zip(base, measured, strict=True)]
        return max(errs) + min(errs)

    lo, hi = -max(measured), max(measured)
    for _ in range(60):
        mid = (lo + hi) / 2
        if tilt(mid) > 0:
            hi = mid
        else:
            lo = mid
    return max(0.0, (lo + hi) / 2)


def fit_constants(points: list[Point]) -> dict[str, float]:
    """Every constant of estimate.MEASURED from these points, in dependency order:

    * host: a run's peak is the larger of its tokenization phase (main process + preprocessing workers, no weights
      yet) and its training phase (per-process floor + modelled terms). The floor is the median residual per
      process of the GPU-machine runs but the smallest (their training phase dominates); the per-worker figure is
      the median over the runs whose RSS timeline shows the phase before the weights load (pre_weights_peak_gib)
      of (that peak - floor) / workers, else from the smallest run, whose peak falls in that phase;
    * GPU context: measured directly, the median of nvidia-smi used minus torch's reserved peak;
    * GPU allocator rounding reserve: the additive constant that minimises the largest relative GPU error of
      the one-GPU runs (the acceptance criterion is a bound on every point, so the fit bounds the worst one);
    * the two multi-GPU slack constants: what closes the published anchors (one point each).
    A constant with no point to fit it from keeps estimate.py's value (the slack constants become 0)."""
    zero = {k: Measured(0.0, "") for k in MEASURED}
    runs = [p for p in points if not p.fitted]
    anchors = [p for p in points if p.fitted]
    out: dict[str, float] = {}

    hosts = sorted((p for p in runs if p.host_gib is not None), key=lambda p: _plan(p, zero).host_memory_gib)
    if len(hosts) >= 2:
        plans = [_plan(p, zero) for p in hosts]
        out["process_host_gib"] = statistics.median(
            (p.host_gib - pl.host_memory_gib) / max(1, p.num_processes) for p, pl in zip(hosts[1:], plans[1:], strict=True)
            if p.host_gib is not None)
        floor = out["process_host_gib"]
        phase = [(p.pre_weights_gib - floor * p.num_processes) / w for p in runs
                 if p.pre_weights_gib and (w := TrainKeys(p.train).preprocessing_workers)]
        workers = TrainKeys(hosts[0].train).preprocessing_workers
        if phase:
            out["preprocessing_worker_gib"] = statistics.median(phase)
        elif workers and hosts[0].host_gib is not None:
            out["preprocessing_worker_gib"] = (hosts[0].host_gib - floor) / workers
    context = [p.gpu_gib - p.gpu_reserved_gib for p in runs if p.gpu_gib and p.gpu_reserved_gib]
    if context:
        out["process_gpu_gib"] = statistics.median(context)
    for k in ("process_host_gib", "preprocessing_worker_gib", "process_gpu_gib"):
        out.setdefault(k, MEASURED[k].value)
    stage = dict(zero, **{k: Measured(v, "") for k, v in out.items()})
    one_gpu = [p for p in runs if p.gpu_gib and p.num_processes == 1]
    if one_gpu:
        out["gpu_allocator_reserve_gib"] = _minimax_shift([_plan(p, stage).gpu_memory_gib_per_gpu for p in one_gpu],
                                                          [float(p.gpu_gib) for p in one_gpu if p.gpu_gib])
    out.setdefault("gpu_allocator_reserve_gib", MEASURED["gpu_allocator_reserve_gib"].value)
    stage = dict(zero, **{k: Measured(v, "") for k, v in out.items()})
    host_slack, gpu_slack = [], []
    for a in anchors:
        plan = _plan(a, stage)
        expert = next(t.gib for t in plan.terms("host") if t.name.startswith("routed experts"))
        if a.host_gib:
            host_slack.append((a.host_gib - plan.host_memory_gib) / expert)
        if a.gpu_gib:
            ctx = out["process_gpu_gib"]
            gpu_slack.append((a.gpu_gib - plan.gpu_memory_gib_per_gpu) / (plan.gpu_memory_gib_per_gpu - ctx))
    out["host_slack_per_expert_gib"] = statistics.median(host_slack) if host_slack else 0.0
    out["gpu_slack_fraction"] = statistics.median(gpu_slack) if gpu_slack else 0.0
    return out


def as_constants(values: dict[str, float]) -> dict[str, Measured]:
    return {k: Measured(v, MEASURED[k].source) for k, v in values.items()}


# ---------------------------------------------------------------- residuals and bands

def predicted(p: Point, resource: str, constants: dict[str, Measured] | None = None) -> float:
    plan = estimate((p.train, p.accelerate), p.arch, constants=constants)
    return plan.host_memory_gib if resource == "host" else plan.gpu_memory_gib_per_gpu


def residual(p: Point, resource: str, *, without_fitted: bool = False,
             constants: dict[str, Measured] | None = None) -> float | None:
    """(predicted - measured) / measured with estimate.py's constants (or ``constants``), None when the point has no
    measurement for the resource. ``without_fitted``: the slack constants fitted to the anchors set to 0."""
    m = p.measured(resource)
    if not m:
        return None
    consts = dict(constants or {})
    if without_fitted:
        consts.update({k: Measured(0.0, "") for k in FITTED_CONSTANTS})
    return (predicted(p, resource, consts or None) - m) / m


def loo_residuals(points: list[Point],
                  fit: Callable[[list[Point]], dict[str, float]] = fit_constants) -> dict[tuple[str, str], float]:
    """{(point name, resource): residual of the point predicted by constants fitted on all the other points}."""
    out: dict[tuple[str, str], float] = {}
    for i, p in enumerate(points):
        consts = as_constants(fit(points[:i] + points[i + 1:]))
        for res in RESOURCES:
            e = residual(p, res, constants=consts)
            if e is not None:
                out[(p.name, res)] = e
    return out


def error_bands(points: list[Point],
                loo: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], float]:
    """{(setting, resource): band} with band = the largest |leave-one-out residual| of the setting's points."""
    loo = loo_residuals(points) if loo is None else loo
    bands: dict[tuple[str, str], float] = {}
    for p in points:
        for res in RESOURCES:
            e = loo.get((p.name, res))
            if e is None:
                continue
            key = (setting(p.num_processes), res)
            bands[key] = max(bands.get(key, 0.0), abs(e))
    return bands


@lru_cache(maxsize=1)
def default_bands() -> dict[tuple[str, str], float]:
    return error_bands(calibration_points())


def band(resource: str, num_processes: int) -> float | None:
    """The relative error band of a host/gpu figure for this many processes (None: no calibration point).
    A setting without its own points takes the widest band of the resource."""
    if resource not in RESOURCES:
        return None
    bands = default_bands()
    b = bands.get((setting(num_processes), resource))
    if b is None:
        same = [v for (s, r), v in bands.items() if r == resource]
        b = max(same) if same else None
    return b


def upper_edge(value_gib: float, resource: str, num_processes: int) -> float:
    """The figure a capacity gate compares with: the prediction at the top of its error band (disk has none)."""
    b = band(resource, num_processes)
    return value_gib * (1 + b) if b else value_gib


def upper_edges(plan: ResourcePlan) -> dict[str, float]:
    """Host, GPU and disk upper edges of a ResourcePlan (one policy for doctor's plan.* and checks.resources)."""
    n = int(plan.setup.get("num_processes") or 1)
    return {"host": upper_edge(plan.host_memory_gib, "host", n),
            "gpu": upper_edge(plan.gpu_memory_gib_per_gpu, "gpu", n),
            "disk": plan.disk_gib}
