"""core/build_clock.py: where an image build is (stage i/N, docker's step n/M) and how long it still takes by the
last build's part-by-part timings, from its output lines alone."""

from ktdeploy.core.build_clock import BuildClock, stage_line

LINES = [  # (seconds since the start, line): what `image build` and docker's classic builder print
    (0, stage_line(1, 5, "deps", "docker build --target deps")),
    (1, "Step 1/3 : FROM ktdeploy/base:bookworm"), (2, " ---> 1a2b3c"),
    (2, "Step 2/3 : RUN pip install --no-index -r /lock/full.lock"), (602, "Successfully installed torch"),
    (602, "Step 3/3 : COPY docker/verify_stack.py /opt/"),
    (603, stage_line(2, 5, "light", "docker build --target light")),
    (603, "Step 1/2 : FROM deps"), (604, "Step 2/2 : COPY ktdeploy /opt/ktdeploy"),
    (610, stage_line(3, 5, "layer", "ktdeploy's own layer")),
    (615, stage_line(4, 5, "verify", "verify_stack")), (700, "verify_stack: ok"),
    (760, stage_line(5, 5, "images", "6 builds")),
]


def _run(clock: BuildClock, upto: int | None = None) -> BuildClock:
    for t, line in LINES[:upto]:
        clock.feed(line, float(t))
    return clock


def test_it_follows_stages_and_steps():
    c = _run(BuildClock(), 4)
    assert c.where() == "stage 1/5 deps: step 2/3" and c.instruction.startswith("RUN pip install")
    c = _run(BuildClock())
    assert c.where() == "stage 5/5 images"
    c.finish(800.0)
    t = c.timings()
    assert t["deps:RUN pip install --no-index -r /lock/full.lock"] == 600 and t["verify"] == 145
    assert t["images"] == 40 and t["deps"] == 1 and sum(t.values()) == 800


def test_no_eta_without_a_last_build():
    assert _run(BuildClock(), 4).remaining(10.0) is None


def test_the_eta_is_what_the_last_build_took_for_the_parts_left():
    last = _run(BuildClock())
    last.finish(800.0)
    c = BuildClock(last=last.timings())
    for t, line in LINES[:4]:               # the pip install step started at t=2
        c.feed(line, float(t))
    left, known = c.remaining(102.0)        # 100 s into the 600 s step
    assert known and left == 800 - 102
    c.feed(LINES[4][1], 602.0)
    c.feed(LINES[5][1], 602.0)
    left, _ = c.remaining(602.0)
    assert left == 800 - 602


def test_a_part_the_last_build_lacked_makes_the_eta_a_lower_bound():
    last = _run(BuildClock())
    last.finish(800.0)
    c = BuildClock(last=last.timings())
    c.feed(stage_line(1, 5, "deps", "x"), 0.0)
    c.feed("Step 1/1 : RUN something new", 1.0)
    left, known = c.remaining(2.0)
    assert not known and left > 0
