"""The planner's calibration points and the error band each setting's figures carry (pure but for reading the
packaged points file).

Points: the cookbook anchors (``anchors.ANCHORS``) and the GPU machine's runs (``data/gpu_peaks.json``, which
``bench/results/gpu_peaks.json`` links to; ``bench/gpu/weight_scale.py`` appends to it). The band of a setting
(single-GPU or multi-GPU) and resource (host or gpu) is the largest |relative residual| among that setting's
points. A point that a constant was fitted to has a ~0 residual by construction, so for it the residual of the
prediction *without* the fitted terms is used instead: the fitted term is the uncertainty there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ktdeploy.core.sizing.anchors import ANCHORS
from ktdeploy.core.sizing.estimate import Measured, estimate
from ktdeploy.core.sizing.model_config import MoEArchitecture, parse_model_config

PEAKS_FILE = Path(__file__).with_name("data") / "gpu_peaks.json"
FITTED_CONSTANTS = ("host_slack_per_expert_gib", "gpu_slack_fraction")
RESOURCES = ("host", "gpu")


@dataclass(frozen=True)
class Point:
    name: str
    arch: MoEArchitecture
    train: dict
    accelerate: dict
    host_gib: float | None
    gpu_gib: float | None          # nvidia-smi memory.used above idle where measured (includes the CUDA context)
    source: str
    fitted: bool                   # a constant in FITTED_CONSTANTS was fitted to this point

    @property
    def num_processes(self) -> int:
        return int(self.accelerate.get("num_processes") or 1)

    def measured(self, resource: str) -> float | None:
        return self.host_gib if resource == "host" else self.gpu_gib


def setting(num_processes: int) -> str:
    return "multi-GPU" if (num_processes or 1) > 1 else "single-GPU"


def gpu_peak_points(data: dict) -> list[Point]:
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
                         source=str(r.get("source") or "bench/results/gpu_peaks.json"), fitted=False))
    return out


def calibration_points(peaks_file: Path = PEAKS_FILE) -> list[Point]:
    pts = [Point(name=a.name, arch=a.arch(), train=a.train, accelerate=a.accelerate, host_gib=a.peak_host_rss_gib,
                 gpu_gib=a.peak_gpu_mem_gib, source=a.source, fitted=True) for a in ANCHORS]
    if peaks_file.is_file():
        pts += gpu_peak_points(json.loads(peaks_file.read_text()))
    return pts


def predicted(p: Point, resource: str, constants: dict[str, Measured] | None = None) -> float:
    plan = estimate((p.train, p.accelerate), p.arch, constants=constants)
    return plan.host_memory_gib if resource == "host" else plan.gpu_memory_gib_per_gpu


def residual(p: Point, resource: str, *, without_fitted: bool = False) -> float | None:
    """(predicted - measured) / measured, or None when the point has no measurement for the resource."""
    m = p.measured(resource)
    if not m:
        return None
    consts = {k: Measured(0.0, "") for k in FITTED_CONSTANTS} if without_fitted else None
    return (predicted(p, resource, consts) - m) / m


def error_bands(points: list[Point]) -> dict[tuple[str, str], float]:
    """{(setting, resource): band} with band = max |residual| (the unfitted one for fitted points)."""
    bands: dict[tuple[str, str], float] = {}
    for p in points:
        for res in RESOURCES:
            e = residual(p, res, without_fitted=p.fitted)
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


def upper_edges(plan) -> dict[str, float]:
    """Host, GPU and disk upper edges of a ResourcePlan (one policy for doctor's plan.* and checks.resources)."""
    n = int(plan.setup.get("num_processes") or 1)
    return {"host": upper_edge(plan.host_memory_gib, "host", n),
            "gpu": upper_edge(plan.gpu_memory_gib_per_gpu, "gpu", n),
            "disk": plan.disk_gib}
