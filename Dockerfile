# ktsft images: base -> deps -> agent -> one final stage per CPU ISA (amx, avx512, avx2).
#
# Build with `ktdeploy image build [--isa amx|avx512|avx2|all] [--stack full|reduced]`: it starts a
# loopback HTTP server over the host-side wheelhouse (docker/wheelhouse.py) and runs
#   docker build --network host --build-arg STACK=... --build-arg LOCK_SHA256=... --target <isa> .
# The build reaches nothing but that wheelhouse (pip --no-index), so it works air-gapped.
# The engine here has no BuildKit/buildx, so this file sticks to the classic builder's syntax;
# the wheels come in over HTTP instead of a bind mount and never land in a layer.
#
# The variant stages only set ENV and LABEL: every variant shares every filesystem layer.

# Any image with Python 3.11 (+ venv), gcc and tini; docker/base/build-base.sh makes the default one
# without a registry. Point it at your own CUDA base with --build-arg BASE_IMAGE=...
ARG BASE_IMAGE=ktdeploy/base:bookworm

############################################################################################
FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1
# Training runs unprivileged: shared memory, memlock and NUMA binding come from `docker run`
# (--ipc=host or --shm-size, --ulimit memlock=-1, --cap-add SYS_NICE), not from root.
RUN python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), "the base image needs Python 3.11, found " + sys.version' \
 && command -v tini >/dev/null && command -v gcc >/dev/null \
 && python3 -m venv /opt/venv \
 && groupadd --gid 1000 kt \
 && useradd --uid 1000 --gid kt --create-home --shell /bin/bash kt \
 && mkdir -p /workspace /opt/ktdeploy/probes \
 && chown kt:kt /workspace
WORKDIR /workspace
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/venv/bin/python", "-m", "ktdeploy.cli.image_entry"]
CMD ["doctor"]

############################################################################################
FROM base AS deps
# STACK: full = the KT stack (torch 2.9.1, ktransformers[sft], sglang-kt, ...); reduced = only
# ktdeploy's own dependencies (CI). Same stages either way.
# WHEELHOUSE_URL: set by `ktdeploy image build` (fixed per stack, so the layer cache survives
# rebuilds); it is not part of what is installed: the lock's hashes are.
# LOCK_SHA256, STACK_VERSIONS, KTDEPLOY_VERSION: what the labels record; the lock's sha256 is also
# checked against the copied lock.
ARG STACK=full WHEELHOUSE_URL=http://127.0.0.1:38711/ LOCK_SHA256= STACK_VERSIONS= KTDEPLOY_VERSION=
ENV KTSFT_STACK=${STACK} \
    DISABLE_VERSION_CHECK=1
# Metadata goes before the big install on purpose: every instruction after it costs a container
# commit, and with the fuse-overlayfs driver (this engine) a commit diffs the whole tree of the
# multi-GB layer below (minutes each). After the install: one COPY, one RUN, USER, and the ISA stage.
LABEL org.opencontainers.image.title="ktsft" \
      org.opencontainers.image.description="KTransformers + LlamaFactory fine-tuning image; entrypoint: the ktdeploy agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${KTDEPLOY_VERSION}" \
      io.ktdeploy.stack="${STACK}" \
      io.ktdeploy.lock.sha256="${LOCK_SHA256}" \
      io.ktdeploy.stack.versions="${STACK_VERSIONS}"
COPY docker/requirements/${STACK}.lock /opt/ktdeploy/requirements.lock
RUN if [ -n "${LOCK_SHA256}" ]; then echo "${LOCK_SHA256}  /opt/ktdeploy/requirements.lock" | sha256sum -c --quiet; fi \
 && pip install --no-index --find-links "${WHEELHOUSE_URL}" --require-hashes --no-deps \
        -r /opt/ktdeploy/requirements.lock

############################################################################################
FROM deps AS agent
# The context is filtered by .dockerignore: pyproject.toml, README.md, recipes/, ktdeploy/, docker/ files.
COPY . /opt/ktdeploy/src/
# Install ktdeploy, compile the probes (ktdeploy/probes/*.c, e.g. the AMX tile-multiply probe) for
# the image's libc into /opt/ktdeploy/probes (where ktdeploy.controller.facts_probes looks first), then verify
# the whole environment: pip check, lock == installed, no upstream forks, the version table.
# A failed verification reruns this step only, never the multi-GB install above.
RUN pip install --no-index --no-deps --no-build-isolation /opt/ktdeploy/src \
 && rm -rf /opt/ktdeploy/src/build \
 && for src in /opt/ktdeploy/src/ktdeploy/probes/*.c; do \
        [ -e "$src" ] || continue; \
        gcc -O1 -o "/opt/ktdeploy/probes/$(basename "$src" .c)" "$src"; \
    done \
 && python /opt/ktdeploy/src/docker/verify_stack.py --stack "${KTSFT_STACK}" --stage agent \
        --stack-file /opt/ktdeploy/src/docker/stack.toml --lock /opt/ktdeploy/requirements.lock
USER kt

############################################################################################
# One final stage per CPU ISA. KTSFT_VARIANT is what the entrypoint checks against the CPU;
# KT_KERNEL_CPU_VARIANT pins kt-kernel's kernel (it trusts the pin and would fault on a CPU
# without the ISA, hence the entrypoint's check).
FROM agent AS amx
ENV KTSFT_VARIANT=amx KT_KERNEL_CPU_VARIANT=amx
LABEL io.ktdeploy.isa="amx" io.ktdeploy.kt_kernel_variant="amx"

FROM agent AS avx512
ENV KTSFT_VARIANT=avx512 KT_KERNEL_CPU_VARIANT=avx512_bf16
LABEL io.ktdeploy.isa="avx512" io.ktdeploy.kt_kernel_variant="avx512_bf16"

FROM agent AS avx2
ENV KTSFT_VARIANT=avx2 KT_KERNEL_CPU_VARIANT=avx2
LABEL io.ktdeploy.isa="avx2" io.ktdeploy.kt_kernel_variant="avx2"
