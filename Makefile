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

.PHONY: deps generate run test bench bench-quick
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

# The end-to-end benchmark (root: BPF): Caddy with and without rakelimit,
# every scenario, 3 repetitions; writes docs/bench/ and the README's bench
# section. About 20 minutes. BENCHFLAGS adds flags, e.g.
# BENCHFLAGS="-variant 'strict=rakelimit 200'".
bench: deps
	go run ./cmd/rakebench -out docs/bench -readme README.md $(BENCHFLAGS)

# Every scenario once and short (under 2 minutes), into a temporary
# directory: the smoke test .ci/run runs. It fails on a broken harness, not
# on figures.
bench-quick: deps
	go run ./cmd/rakebench -scale 0.2 -transfer-scale 0.1 -reps 1 -out $$(mktemp -d /tmp/rakebench-quick.XXXXXX) $(BENCHFLAGS)
