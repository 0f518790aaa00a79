# Developer entry points; the README's two commands are `sudo make run` and
# `sudo make test`.

# Pinned toolchain for the BPF object: CI regenerates with exactly this and
# fails when the committed output differs.
BPF_CLANG ?= clang-16
BPF_CFLAGS ?= -O2 -g -Wall -Werror -mcpu=v3
export BPF_CLANG BPF_CFLAGS

# Debian packages the tests use: ip (network namespaces), setpriv (dropping
# CAP_BPF), gtlsclient (an independent HTTP/3 client).
DEB_PACKAGES = iproute2 util-linux ngtcp2-client

.PHONY: deps generate run test
deps:
	@if ! command -v ip >/dev/null || ! command -v setpriv >/dev/null || ! command -v gtlsclient >/dev/null; then \
		echo "installing $(DEB_PACKAGES)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PACKAGES) >/dev/null; \
	fi

generate:
	cd bpf && go generate ./...

# Caddy with rakelimit on the example config (root: loading BPF needs CAP_BPF).
run:
	go run ./cmd/caddy run --config testdata/Caddyfile

# BPF tests need root (CAP_BPF, CAP_NET_ADMIN for namespaces).
test: deps
	go test ./...
