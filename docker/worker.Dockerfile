# syntax=docker/dockerfile:1
# A kjob worker image: the handler-crate example's worker binary. Build from
# the repository root:
#   docker build -f docker/worker.Dockerfile -t kjob-example-worker .
# For your own handler crate, change the package name (-p) and the binary.
FROM rust:1-bookworm AS build
# The default features link librdkafka statically (built from source by
# rdkafka-sys with cc and make, which the image has) and zlib dynamically;
# nothing else (no OpenSSL, SASL, zstd or curl: those are opt-in features).
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kjob-example-handler-crate \
 && cp target/release/kjob-example-handler-crate /usr/local/bin/kjob-worker

FROM debian:bookworm-slim
# What the binary links besides glibc: zlib (libz.so.1). bash (in the base
# image) runs the healthcheck, so no HTTP client is installed for it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 kjob
COPY --from=build /usr/local/bin/kjob-worker /usr/local/bin/kjob-worker
USER kjob
ENV KJOB_BOOTSTRAP_SERVERS=kafka:19092 \
    KJOB_SCHEMA_REGISTRY_URL=http://registry:8080/apis/ccompat/v7 \
    KJOB_METRICS_ADDR=0.0.0.0:9464 \
    RUST_LOG=info
# /metrics (Prometheus), /healthz (alive) and /readyz (partitions assigned).
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/local/bin/kjob-worker"]
