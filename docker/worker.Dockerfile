# syntax=docker/dockerfile:1
# The kjob orders example as a container. Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t kjob-example-orders .
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake pkg-config zlib1g-dev libssl-dev libsasl2-dev libzstd-dev libcurl4-openssl-dev python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p kjob-example-orders \
 && cp target/release/kjob-example-orders /usr/local/bin/kjob-example-orders

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g libsasl2-2 libzstd1 libcurl4 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 kjob
COPY --from=build /usr/local/bin/kjob-example-orders /usr/local/bin/kjob-example-orders
USER kjob
ENV KJOB_BOOTSTRAP_SERVERS=kafka:19092 \
    KJOB_SCHEMA_REGISTRY_URL=http://registry:8080/apis/ccompat/v7 \
    RUST_LOG=info
ENTRYPOINT ["/usr/local/bin/kjob-example-orders"]
