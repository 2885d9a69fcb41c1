# RecGuide-TRT served by NVIDIA Triton Inference Server (python backend, decoupled streaming).
#
#   docker build -t recguide-triton .
#   docker run --gpus all --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 recguide-triton
#   docker run --gpus all --rm -p 8001:8001 -v /data/ckpt:/models/ckpt:ro \
#       -e RECGUIDE_MODEL=/models/ckpt -e RECGUIDE_BACKEND=tensorrt recguide-triton
#
# The base is the Triton container with TensorRT(-LLM) inside (TensorRT headers and libraries for
# the plugin, CUDA toolkit for nvcc). The package lives in a venv that sees the container's
# packages; its bin/ is first on PATH, which is how Triton's python-backend stub finds the
# interpreter with recguide_trt and numpy<2 (docs/DESIGN.md §4). The model repository is written
# at start from RECGUIDE_MODEL / RECGUIDE_BACKEND by scripts/serve_triton.sh.
ARG TRITON_TAG=24.12
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-trtllm-python-py3

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV VIRTUAL_ENV=/opt/recguide/venv \
    TENSORRT_ROOT=/usr/local/tensorrt \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
ENV PATH=${VIRTUAL_ENV}/bin:${PATH}

WORKDIR /opt/recguide/src
COPY pyproject.toml constraints.txt README.md* ./
COPY recguide_trt ./recguide_trt
COPY plugins ./plugins
COPY scripts ./scripts

# torch==2.13.0 from constraints.txt resolves to the CUDA build on PyPI.
RUN python3 -m venv --system-site-packages "${VIRTUAL_ENV}" \
 && pip install --no-cache-dir "cmake==3.31.6" \
 && pip install --no-cache-dir ".[trt,triton]" -c constraints.txt \
 && python -c "import numpy, sys; sys.exit(int(numpy.__version__.split('.')[0]) >= 2)"

# Fused mismatch kernel + TensorRT plugin (plugins/CMakeLists.txt); H100/H200 (sm_90) by default.
ARG CUDA_ARCHS=90
RUN cmake -S plugins -B plugins/build -DTENSORRT_ROOT="${TENSORRT_ROOT}" \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" -DCMAKE_BUILD_TYPE=Release \
 && cmake --build plugins/build -j"$(nproc)" \
 && install -d /opt/recguide/lib \
 && install -m 0644 plugins/build/*.so /opt/recguide/lib/ \
 && rm -rf plugins/build

# The default model (SmolLM2-135M-Instruct) is imported into the image's model cache at build time, so a
# container starts without fetching it (the cache also takes the step-cost tables at run time).
ENV RECGUIDE_CACHE=/opt/recguide/cache
RUN python -c "from recguide_trt.models import resolve_model; print(resolve_model('smollm2-135m'))"

ENV RECGUIDE_PLUGIN_DIR=/opt/recguide/lib \
    RECGUIDE_MODEL=default \
    RECGUIDE_BACKEND=torch \
    BIND_ADDRESS=0.0.0.0 \
    OUT=/tmp/recguide-triton

EXPOSE 8000 8001 8002
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD ["curl", "-sf", "http://127.0.0.1:8000/v2/models/recguide/ready"]
ENTRYPOINT ["/opt/recguide/src/scripts/serve_triton.sh"]
CMD ["--", "--instance-kind", "gpu"]
