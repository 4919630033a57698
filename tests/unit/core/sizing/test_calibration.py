"""Every committed calibration point is within ±10 % host and GPU, and the error bands are cross-validated.

Points: the cookbook anchors (the two multi-GPU slack constants are one-point fits to the Qwen3-235B row) and every
run in bench/results/gpu_peaks.json. The bands are leave-one-out: each point predicted by constants fitted without
it. A point added to gpu_peaks.json (bench/gpu/weight_scale.py and vocab_scale.py append there) is checked here
without any edit to this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktdeploy.core.sizing import calibration as cal
from ktdeploy.core.sizing.calibration import Point, calibration_points, error_bands, residual, upper_edge

ROOT = Path(__file__).resolve().parents[4]
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


LOO = cal.loo_residuals(POINTS)


def test_bands_are_the_largest_leave_one_out_residual_per_setting():
    bands = error_bands(POINTS, LOO)
    assert set(bands) == {("single-GPU", "host"), ("single-GPU", "gpu"), ("multi-GPU", "host"), ("multi-GPU", "gpu")}
    for (st, res), b in bands.items():
        assert b == pytest.approx(max(abs(LOO[(p.name, res)]) for p in POINTS
                                      if cal.setting(p.num_processes) == st and (p.name, res) in LOO))
    assert error_bands(POINTS) == pytest.approx(bands)
    # the cookbook row is the only multi-GPU point: left out, the slack constants fitted to it vanish, so its
    # leave-one-out residual is its residual without them (the old "unfitted" rule falls out of the LOO)
    cook = next(p for p in POINTS if p.fitted)
    assert abs(residual(cook, "host")) < 1e-3
    assert LOO[(cook.name, "host")] == pytest.approx(residual(cook, "host", without_fitted=True), abs=1e-3)
    assert bands[("multi-GPU", "host")] > 0.05


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_the_band_covers_every_committed_point(point: Point):
    """Shown on the committed points: the band of the point's setting covers its in-sample and its
    leave-one-out residual."""
    for res in ("host", "gpu"):
        e = residual(point, res)
        if e is None:
            continue
        b = cal.band(res, point.num_processes)
        assert b is not None and abs(e) <= b and abs(LOO[(point.name, res)]) <= b + 1e-12


def test_leave_one_out_refits_without_the_point():
    """A point a fitted constant depends on moves when left out; the refit on all points is estimate.py's."""
    from ktdeploy.core.sizing.estimate import MEASURED

    full = cal.fit_constants(POINTS)
    for k, v in full.items():
        assert MEASURED[k].value == pytest.approx(v, rel=0.01, abs=1e-3), k
    medium = next(p for p in POINTS if p.name == "medium")
    without = cal.fit_constants([p for p in POINTS if p is not medium])
    assert without["gpu_allocator_reserve_gib"] != pytest.approx(full["gpu_allocator_reserve_gib"])
    assert LOO[("medium", "gpu")] != pytest.approx(residual(medium, "gpu"))
    # no anchor, no slack: the multi-GPU constants are fitted to the published row only
    runs_only = cal.fit_constants([p for p in POINTS if not p.fitted])
    assert runs_only["host_slack_per_expert_gib"] == 0 and runs_only["gpu_slack_fraction"] == 0


def test_minimax_shift_bounds_the_worst_relative_error():
    base, measured = [1.0, 2.0, 4.0], [1.2, 2.1, 4.5]
    c = cal._minimax_shift(base, measured)
    errs = [(b + c - m) / m for b, m in zip(base, measured, strict=True)]
    assert max(errs) == pytest.approx(-min(errs), abs=1e-9)
    for other in (c - 0.01, c + 0.01):
        assert max(abs((b + other - m) / m) for b, m in zip(base, measured, strict=True)) > max(map(abs, errs))
    assert cal._minimax_shift([2.0, 3.0], [1.0, 1.5]) == 0.0        # never a negative reserve


def test_a_worse_point_widens_its_band_only():
    base = error_bands(POINTS, LOO)
    p = next(p for p in POINTS if not p.fitted and p.num_processes == 1)
    off = Point(**{**p.__dict__, "name": "off", "host_gib": p.host_gib * 0.8})
    wider = error_bands(POINTS + [off])
    assert wider[("single-GPU", "host")] > base[("single-GPU", "host")]
    assert wider[("multi-GPU", "host")] == pytest.approx(base[("multi-GPU", "host")], rel=0.02)


def test_upper_edge_and_disk():
    b = cal.band("host", 2)
    assert upper_edge(100.0, "host", 2) == pytest.approx(100.0 * (1 + b))
    assert upper_edge(100.0, "disk", 2) == 100.0
    assert cal.band("gpu", 8) == cal.band("gpu", 2)     # same setting


def test_readme_planner_figures_are_the_computed_ones():
    """docs/planner.md's calibration figures (runs, peaks, worst error, context, bands) are what the code computes now."""
    import re

    from ktdeploy.core.sizing.estimate import MEASURED

    text = " ".join((ROOT / "docs" / "planner.md").read_text().split())
    runs = json.loads(BENCH_PEAKS.read_text())["runs"]
    errors = [e for p in POINTS for r in ("host", "gpu") if (e := residual(p, r)) is not None]
    assert f"and {len(runs)} one-GPU runs measured" in text
    assert f"Every one of the {len(errors)} measured peaks is predicted within ±{max(map(abs, errors)) * 100:.1f} %" in text
    assert f"The GPU context ({MEASURED['process_gpu_gib'].value:.3f} GiB) is measured" in text
    bands = error_bands(POINTS, LOO)
    m = re.search(r"single-GPU host ±([\d.]+) %, GPU ±([\d.]+) %; multi-GPU host ±([\d.]+) %, GPU ±([\d.]+) %", text)
    assert m, "docs/planner.md: band sentence not found"
    want = [bands[("single-GPU", "host")], bands[("single-GPU", "gpu")], bands[("multi-GPU", "host")],
            bands[("multi-GPU", "gpu")]]
    assert [float(x) for x in m.groups()] == [round(b * 100, 1) for b in want]
