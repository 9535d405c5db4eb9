# syntax=docker/dockerfile:1
# The hanzod image: `docker build -t hanzod .` (compose.yml builds it as hanzod:local).
# Runs `hanzod serve`: gRPC on 9550, Prometheus metrics, /healthz and /readyz on 9551.

# The toolchain is the workspace's rust-version (Cargo.toml; tests/deploy.rs keeps them
# equal). The builder is Debian bookworm like the runtime image, so the binary links
# against the glibc it runs with. Nothing but a C compiler (for ring) is needed: the .proto
# files are compiled by protox, without protoc.
FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p hanzod --no-default-features --bin hanzod \
 && install -D -m 0755 target/release/hanzod /out/hanzod

FROM debian:bookworm-slim
# ca-certificates: TLS to the chain RPC, Kubo and the Hugging Face Hub.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 hanzod \
 && useradd --system --uid 10001 --gid hanzod --home-dir /var/lib/hanzod \
      --shell /usr/sbin/nologin hanzod \
 && install -d -o hanzod -g hanzod -m 0750 /var/lib/hanzod /etc/hanzod
COPY --from=builder /out/hanzod /usr/local/bin/hanzod
# /var/lib/hanzod is owned by the user, so a fresh named volume mounted there is writable.
USER 10001:10001
WORKDIR /var/lib/hanzod
EXPOSE 9550 9551
# Liveness only: a standby replica is alive but not ready (`hanzod health --ready`).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["hanzod", "health", "--addr", "127.0.0.1:9551"]
ENTRYPOINT ["hanzod"]
CMD ["serve"]
