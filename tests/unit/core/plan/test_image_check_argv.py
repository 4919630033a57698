"""The image readiness check starts the image with exactly the training container's flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ktdeploy.core.plan import docker_argv as dk

VOLS = SimpleNamespace(model="/m", data="/d", output="/o")


def _after_labels(argv: list[str]) -> list[str]:
    """The flags between the labels/name and the first --mount / --env PYTHONUNBUFFERED."""
    i = max(k for k, a in enumerate(argv) if a == "--label") + 2
    j = next(k for k in range(i, len(argv)) if argv[k] in ("--mount", "--env") and not argv[k + 1].startswith("HOME="))
    return argv[i:j]


@pytest.mark.parametrize("gpus", [None, [0], [2, 3]])
@pytest.mark.parametrize("memlock", [True, False])
@pytest.mark.parametrize("user", [None, "1000:1000", "0:0"])
def test_same_flags_as_create_train_and_tune(gpus, memlock, user):
    train = dk.create_train(name="j", image="ktsft:amx", run_id="r", volumes=VOLS, output_dir="/o", gpus=gpus,
                            memlock=memlock, user=user)
    tune = dk.create_tune(name="j", image="ktsft:amx", run_id="r", volumes=VOLS, output_dir="/o", gpus=gpus,
                          workdir="/w", budget_minutes=5, memlock=memlock, user=user)
    check = dk.image_check("ktsft:amx", name="c", gpus=gpus, memlock=memlock, user=user)
    flags = dk.training_flags(gpus=gpus, memlock=memlock, user=user)
    assert _after_labels(train) == flags == _after_labels(tune) == _after_labels(check)
    assert check[:6] == ["docker", "run", "--detach", "--rm", "--pull", "never"]
    assert check[-3:] == ["--", "ktsft:amx", str(dk.IMAGE_CHECK_SECONDS)] and "--privileged" not in check
    assert check[check.index("--entrypoint") + 1] == "sleep"
