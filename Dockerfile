# syntax=docker/dockerfile:1

# ---- build: a static, reproducible binary ----
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/keybrake ./cmd/keybrake \
 && install -d -m 0700 /out/data

# ---- run: distroless static (CA certificates, tzdata, a nonroot user; no shell) ----
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/keybrake /keybrake
# The data directory belongs to the nonroot user (65532) with mode 0700, so a fresh
# named volume mounted on /data starts out writable by keybrake and nobody else.
COPY --from=build --chown=65532:65532 /out/data /data
USER nonroot:nonroot
EXPOSE 8080 8081
VOLUME /data
ENTRYPOINT ["/keybrake"]
# The admin API listens on all interfaces inside the container (127.0.0.1 there
# would be unreachable from the host). It must not be reachable from the network:
# publish it on the host's loopback only (docker run -p 127.0.0.1:8081:8081) or
# not at all. The proxy on 8080 is the only port meant for callers; set
# KEYBRAKE_PUBLIC_URL to the address they use.
CMD ["serve", "--data-dir", "/data", "--admin-listen", ":8081"]
