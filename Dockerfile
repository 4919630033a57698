# ktsft images: base -> deps-cuda -> deps (+ light, on base) -> one final image per CPU ISA (amx, avx512, avx2).
#
# Build with `ktdeploy image build [--isa amx|avx512|avx2|all] [--stack full|reduced]`: it starts a
# loopback HTTP server over the host-side wheelhouse (docker/wheelhouse.py) and runs
#   docker build --network host --build-arg STACK=... --build-arg LOCK_SHA256=... --target <isa> .
# The build reaches nothing but that wheelhouse (pip --no-index), so it works air-gapped.
# The engine here has no BuildKit/buildx, so this file sticks to the classic builder's syntax;
# the wheels come in over HTTP instead of a bind mount and never land in a layer.
#
# The variant stages only set ENV and LABEL: every variant shares every filesystem layer.

# Any image with Python 3.11 (+ venv, + headers: python3.11-dev), gcc and tini; docker/base/build-base.sh makes the default one
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
 && { test -f /usr/include/python3.11/Python.h || { echo "the base image lacks Python.h (python3.11-dev): Triton compiles its launcher with it" >&2; exit 1; }; } \
 && python3 -m venv /opt/venv \
 && groupadd --gid 1000 kt \
 && useradd --uid 1000 --gid kt --create-home --shell /bin/bash kt \
 && mkdir -p /workspace /opt/ktdeploy/probes \
 && chown kt:kt /workspace
WORKDIR /workspace
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/venv/bin/python", "-m", "ktdeploy.cli.image_entry"]
CMD ["doctor"]

############################################################################################
# The dependency layers. No ktdeploy file and no ktdeploy version reaches them: a code change or a
# version bump leaves both layers (and their IDs) as they were. Every .pyc is compiled with
# unchecked-hash invalidation (content-addressed, no timestamps), so two builds of the same lock give
# byte-identical files.
FROM base AS deps-cuda
# STACK: full = the KT stack (torch 2.9.1, ktransformers[sft], sglang-kt, ...); reduced = only
# ktdeploy's own dependencies (CI). Same stages either way.
# WHEELHOUSE_URL: set by `ktdeploy image build` (fixed per stack, so the layer cache survives
# rebuilds); it is not part of what is installed: the lock's hashes are.
# LOCK_SHA256: checked against the copied lock.
ARG STACK=full WHEELHOUSE_URL=http://127.0.0.1:38711/ LOCK_SHA256=
ENV KTSFT_STACK=${STACK} \
    DISABLE_VERSION_CHECK=1
COPY docker/requirements/${STACK}.lock /opt/ktdeploy/requirements.lock
COPY docker/lockpart.py /opt/ktdeploy/lockpart.py
# CUDA + torch (+ triton, the nvidia-* libraries): the multi-GB layer a serving-stack bump keeps.
RUN if [ -n "${LOCK_SHA256}" ]; then echo "${LOCK_SHA256}  /opt/ktdeploy/requirements.lock" | sha256sum -c --quiet; fi \
 && python3 /opt/ktdeploy/lockpart.py /opt/ktdeploy/requirements.lock cuda >/tmp/cuda.lock \
 && if [ -s /tmp/cuda.lock ]; then \
        pip install --no-index --find-links "${WHEELHOUSE_URL}" --require-hashes --no-deps --no-compile -r /tmp/cuda.lock \
     && python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv/lib >/dev/null; fi \
 && rm -f /tmp/cuda.lock

FROM deps-cuda AS deps
ARG WHEELHOUSE_URL=http://127.0.0.1:38711/
# The serving/training stack (ktransformers, LlamaFactory-KT, sglang-kt, ...): the rest of the lock.
RUN python3 /opt/ktdeploy/lockpart.py /opt/ktdeploy/requirements.lock rest >/tmp/rest.lock \
 && pip install --no-index --find-links "${WHEELHOUSE_URL}" --require-hashes --no-deps --no-compile -r /tmp/rest.lock \
 && python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv/lib >/dev/null \
 && rm -f /tmp/rest.lock

############################################################################################
# The light stage: ktdeploy, the compiled probes and the verifier, built on the base (not on the
# multi-GB deps), staged under /stage exactly as they land in the image. Files get the fixed mtime
# SOURCE_DATE_EPOCH and unchecked-hash .pycs, so the same sources give the same bytes.
FROM base AS light
ARG WHEELHOUSE_URL=http://127.0.0.1:38711/ STACK=full SOURCE_DATE_EPOCH=0
COPY docker/requirements/${STACK}.lock /tmp/requirements.lock
RUN grep -A1 '^setuptools==' /tmp/requirements.lock >/tmp/setuptools.lock \
 && pip install --no-index --find-links "${WHEELHOUSE_URL}" --require-hashes --no-deps -r /tmp/setuptools.lock
# The context is filtered by .dockerignore: pyproject.toml, README.md, recipes/, ktdeploy/, docker/ files.
COPY . /opt/ktdeploy/src/
RUN pip install --no-index --no-deps --no-build-isolation --no-compile --root /stage /opt/ktdeploy/src \
 && mkdir -p /stage/opt/ktdeploy/probes /stage/opt/ktdeploy/verify \
 && for src in /opt/ktdeploy/src/ktdeploy/probes/*.c; do \
        [ -e "$src" ] || continue; \
        gcc -O1 -o "/stage/opt/ktdeploy/probes/$(basename "$src" .c)" "$src"; \
    done \
 && cp /opt/ktdeploy/src/docker/verify_stack.py /opt/ktdeploy/src/docker/stack.toml /stage/opt/ktdeploy/verify/ \
 && python -m compileall -q --invalidation-mode unchecked-hash -s /stage -p / /stage/opt/venv/lib >/dev/null \
 && find /stage -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +

############################################################################################
# `ktdeploy image build` does not use the stages below: it turns /stage of `light` into one layer, `docker load`s
# `deps` + that layer (no commit of the big tree), runs the verification in it (docker/verify_stack.py, which
# gates the tags) and loads every ISA variant with its ENV/LABEL/USER (controller/images/image_config.py).
# They stay for a plain `docker build --target amx .` and show what each variant is.
FROM deps AS agent
COPY --from=light /stage/ /
USER kt

# One final stage per kt-kernel CPU build (ktdeploy/core/variants.py). KTSFT_VARIANT is what the entrypoint checks
# against the CPU; KT_KERNEL_CPU_VARIANT pins kt-kernel's build (it trusts the pin and would fault on a CPU
# without the ISA, hence the entrypoint's check). The tag is the build's name.
FROM agent AS amx
ENV KTSFT_VARIANT=amx KT_KERNEL_CPU_VARIANT=amx
LABEL io.ktdeploy.isa="amx" io.ktdeploy.kt_kernel_variant="amx"

FROM agent AS avx512_bf16
ENV KTSFT_VARIANT=avx512_bf16 KT_KERNEL_CPU_VARIANT=avx512_bf16
LABEL io.ktdeploy.isa="avx512_bf16" io.ktdeploy.kt_kernel_variant="avx512_bf16"

FROM agent AS avx512_vbmi
ENV KTSFT_VARIANT=avx512_vbmi KT_KERNEL_CPU_VARIANT=avx512_vbmi
LABEL io.ktdeploy.isa="avx512_vbmi" io.ktdeploy.kt_kernel_variant="avx512_vbmi"

FROM agent AS avx512_vnni
ENV KTSFT_VARIANT=avx512_vnni KT_KERNEL_CPU_VARIANT=avx512_vnni
LABEL io.ktdeploy.isa="avx512_vnni" io.ktdeploy.kt_kernel_variant="avx512_vnni"

FROM agent AS avx512_base
ENV KTSFT_VARIANT=avx512_base KT_KERNEL_CPU_VARIANT=avx512_base
LABEL io.ktdeploy.isa="avx512_base" io.ktdeploy.kt_kernel_variant="avx512_base"

FROM agent AS avx2
ENV KTSFT_VARIANT=avx2 KT_KERNEL_CPU_VARIANT=avx2
LABEL io.ktdeploy.isa="avx2" io.ktdeploy.kt_kernel_variant="avx2"
