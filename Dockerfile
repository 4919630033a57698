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

############################################################################################
FROM base AS deps
# full: the KT stack (torch 2.9.1, ktransformers[sft], sglang-kt, ...); reduced: only ktdeploy's
# own dependencies (CI). Same stages either way.
ARG STACK=full
# Set by `ktdeploy image build` (fixed per stack so the layer cache survives rebuilds); the URL is
# not part of what is installed: the lock's hashes are.
ARG WHEELHOUSE_URL=http://127.0.0.1:38711/
ENV KTSFT_STACK=${STACK} \
    DISABLE_VERSION_CHECK=1
COPY docker/requirements/${STACK}.lock /opt/ktdeploy/requirements.lock
RUN pip install --no-index --find-links "${WHEELHOUSE_URL}" --require-hashes --no-deps \
        -r /opt/ktdeploy/requirements.lock
COPY docker/stack.toml docker/verify_stack.py /opt/ktdeploy/
# A layer of its own, so a failed verification reruns in seconds, not a multi-GB install.
RUN python /opt/ktdeploy/verify_stack.py --stack "${STACK}" --stage deps \
        --stack-file /opt/ktdeploy/stack.toml --lock /opt/ktdeploy/requirements.lock

############################################################################################
FROM deps AS agent
# The lock's sha256, checked against the copied lock and recorded in a label.
ARG LOCK_SHA256=
COPY pyproject.toml README.m[d] /opt/ktdeploy/src/
COPY recipes /opt/ktdeploy/src/recipes
COPY ktdeploy /opt/ktdeploy/src/ktdeploy
# Probes (ktdeploy/probes/*.c, e.g. the AMX tile-multiply probe) are compiled here, for the
# image's libc, into /opt/ktdeploy/probes where ktdeploy.facts.probes looks first.
RUN if [ -n "${LOCK_SHA256}" ]; then echo "${LOCK_SHA256}  /opt/ktdeploy/requirements.lock" | sha256sum -c --quiet; fi \
 && pip install --no-index --no-deps --no-build-isolation /opt/ktdeploy/src \
 && rm -rf /opt/ktdeploy/src/build \
 && for src in /opt/ktdeploy/src/ktdeploy/probes/*.c; do \
        [ -e "$src" ] || continue; \
        gcc -O1 -o "/opt/ktdeploy/probes/$(basename "$src" .c)" "$src"; \
    done \
 && python /opt/ktdeploy/verify_stack.py --stack "${KTSFT_STACK}" --stage agent \
        --stack-file /opt/ktdeploy/stack.toml --lock /opt/ktdeploy/requirements.lock
ARG STACK_VERSIONS=
LABEL org.opencontainers.image.title="ktsft" \
      org.opencontainers.image.description="KTransformers + LlamaFactory fine-tuning image; entrypoint: the ktdeploy agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.ktdeploy.stack="${KTSFT_STACK}" \
      io.ktdeploy.lock.sha256="${LOCK_SHA256}" \
      io.ktdeploy.stack.versions="${STACK_VERSIONS}"
USER kt
WORKDIR /workspace
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/venv/bin/python", "-m", "ktdeploy.agent.entry"]
CMD ["doctor"]

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
