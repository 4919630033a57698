"""Every committed calibration point is within ±10 % host and GPU, and the error bands come from the residuals.

Points: the cookbook anchors (fitted: the two multi-GPU slack constants are one-point fits to the Qwen3-235B row)
and every run in bench/results/gpu_peaks.json (not fitted but for the per-process floors). A point added to
gpu_peaks.json (bench/gpu/weight_scale.py appends there) is checked here without any edit to this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktdeploy.core.sizing import calibration as cal
from ktdeploy.core.sizing.calibration import Point, calibration_points, error_bands, residual, upper_edge

ROOT = Path(__file__).resolve().parents[3]
BENCH_PEAKS = ROOT / "bench/results/gpu_peaks.json"
POINTS = calibration_points()
TOLERANCE = 0.10


def test_bench_results_is_the_packaged_file():
    assert BENCH_PEAKS.resolve() == cal.PEAKS_FILE.resolve()
    runs = json.loads(BENCH_PEAKS.read_text())["runs"]
    assert len([p for p in POINTS if not p.fitted]) == len(runs) >= 3
    assert any(p.fitted for p in POINTS)          # the cookbook row stays a check


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
@pytest.mark.parametrize("resource", ["host", "gpu"])
def test_point_within_ten_percent(point: Point, resource: str):
    e = residual(point, resource)
    if e is None:
        pytest.skip(f"{point.name} has no {resource} measurement")
    assert abs(e) <= TOLERANCE, f"{point.name} {resource}: {e * 100:+.1f} % (source: {point.source})"


def test_bands_are_the_largest_residual_per_setting():
    bands = error_bands(POINTS)
    assert set(bands) == {("single-GPU", "host"), ("single-GPU", "gpu"), ("multi-GPU", "host"), ("multi-GPU", "gpu")}
    single = [p for p in POINTS if p.num_processes == 1]
    assert bands[("single-GPU", "gpu")] == pytest.approx(max(abs(residual(p, "gpu")) for p in single))
    # the fitted cookbook row contributes its residual *without* the fitted terms, never its ~0 fitted one
    cook = next(p for p in POINTS if p.fitted)
    assert abs(residual(cook, "host")) < 1e-3
    assert bands[("multi-GPU", "host")] == pytest.approx(abs(residual(cook, "host", without_fitted=True)))
    assert bands[("multi-GPU", "host")] > 0.05


def test_a_worse_point_widens_its_band_only():
    base = error_bands(POINTS)
    p = next(p for p in POINTS if not p.fitted and p.num_processes == 1)
    off = Point(**{**p.__dict__, "name": "off", "host_gib": p.host_gib * 0.8})
    wider = error_bands(POINTS + [off])
    assert wider[("single-GPU", "host")] > base[("single-GPU", "host")]
    assert wider[("multi-GPU", "host")] == base[("multi-GPU", "host")]


def test_upper_edge_and_disk():
    b = cal.band("host", 2)
    assert upper_edge(100.0, "host", 2) == pytest.approx(100.0 * (1 + b))
    assert upper_edge(100.0, "disk", 2) == 100.0
    assert cal.band("gpu", 8) == cal.band("gpu", 2)     # same setting
