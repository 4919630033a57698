"""core/loss_curve.py and its two renderings: the PNG (matplotlib) and `status --plot` (plotext)."""

import json

from ktdeploy.core.loss_curve import curve

LOG = "\n".join([json.dumps({"current_steps": 1, "total_steps": 4, "loss": 2.0}),
                 json.dumps({"current_steps": 2, "total_steps": 4, "loss": 1.5}),
                 '{"current_steps": 3, "tot',   # torn: still being written
                 json.dumps({"current_steps": 2, "total_steps": 4, "eval_loss": 1.7}),
                 json.dumps({"current_steps": 2, "total_steps": 4, "loss": 1.4}),   # a resumed run's step 2 again
                 json.dumps({"current_steps": 4, "total_steps": 4, "loss": float("nan")})])


def test_curve_keeps_training_and_eval_losses_by_step():
    c = curve(LOG)
    assert (c.steps, c.loss) == ([1, 2], [2.0, 1.4]) and (c.eval_steps, c.eval_loss) == ([2], [1.7])
    assert not curve("garbage\n[1]")


def test_the_png_is_a_png_and_plotext_draws_in_the_terminal(tmp_path, capsys):
    from ktdeploy.cli.status_extra import draw
    from ktdeploy.controller.loss_plot import write_loss_png

    p = write_loss_png(tmp_path, curve(LOG), "run")
    assert p is not None and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert write_loss_png(tmp_path, curve(""), "run") is None
    draw(curve(LOG), "run", width=60, height=12)
    out = capsys.readouterr().out
    assert "loss run" in out and "training loss" in out and "eval loss" in out
