"""Image builds: the ktsft images from the repo's Dockerfile, offline, one variant per CPU ISA.

lockfile  -- read docker/requirements/<stack>.lock (pins, hash, the files a wheelhouse must hold)
wheelhouse -- check a host-side wheelhouse against a lock and serve it on loopback for `docker build`
docker_cli -- the docker CLI through argv lists (build, inspect, save, load)
build     -- build the variants, tag them, and report per-stage timings and the layers they share
"""

from ktdeploy.controller.images.lockfile import Lock, read_lock
from ktdeploy.controller.images.tags import ISA_VARIANTS, STACKS, image_tag

__all__ = ["ISA_VARIANTS", "STACKS", "Lock", "image_tag", "read_lock"]
