# syntax=docker/dockerfile:1
# The kjob operator CLI as an image. Build from the repository root:
#   docker build -f docker/cli.Dockerfile -t kjob-cli .
# Run it on the compose network, e.g.:
#   docker run --rm --network kjob_default kjob-cli status --topic invoices.render --group invoices
FROM rust:1-bookworm AS build
# Default features: librdkafka built from source (cc, make), zlib linked
# dynamically; the `postgres` feature (`kjob outbox`) is pure Rust.
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kjob-cli \
 && cp target/release/kjob /usr/local/bin/kjob

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 kjob
COPY --from=build /usr/local/bin/kjob /usr/local/bin/kjob
USER kjob
ENV KJOB_BOOTSTRAP_SERVERS=kafka:19092 \
    KJOB_SCHEMA_REGISTRY_URL=http://registry:8080/apis/ccompat/v7
ENTRYPOINT ["/usr/local/bin/kjob"]
CMD ["--help"]
