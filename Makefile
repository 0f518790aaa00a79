# Developer entry points; the README's two commands are `make run` and
# `make test`. Both work as root (no sudo needed) and as a user with sudo:
# Go builds as the calling user, and only what needs privileges (installing
# packages, loading BPF) runs through sudo.

# Pinned toolchain for the BPF object: CI regenerates with exactly this and
# fails when the committed output differs.
BPF_CLANG ?= clang-16
BPF_CFLAGS ?= -O2 -g -Wall -Werror -mcpu=v3
export BPF_CLANG BPF_CFLAGS

# Go where its installer puts it, for shells (and sudo) that lack it on PATH.
export PATH := $(PATH):/usr/local/go/bin

# SUDO runs a command as root: nothing for root, sudo for anyone else,
# keeping the variables the tests read.
ifeq ($(shell id -u),0)
SUDO :=
else
SUDO := sudo --preserve-env=CI,RAKELIMIT_REQUIRE_BPF
endif

# Debian packages the tests use: ip (network namespaces), setpriv (dropping
# privileges), setcap (granting capabilities to a copy of the test binary),
# gtlsclient (an independent HTTP/3 client), gcc (the race detector needs cgo),
# tmux (a real terminal for `caddy rakelimit top`), chromium (a browser as an
# HTTP/3 client, headless; about 350 MB installed), nft (a port redirect in
# front of mode xdp's listener).
DEB_PACKAGES = iproute2 util-linux libcap2-bin ngtcp2-client gcc tmux chromium nftables
DEB_COMMANDS = ip setpriv setcap gtlsclient gcc tmux chromium nft

.PHONY: deps generate run test test-kernels test-quicgo fuzz bench bench-quick bench-filter bench-xdp bench-virtio
deps:
	@missing=; for c in $(DEB_COMMANDS); do \
		PATH="$$PATH:/usr/sbin:/sbin" command -v $$c >/dev/null || missing="$$missing $$c"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing $(DEB_PACKAGES) (missing:$$missing)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PACKAGES) >/dev/null; \
	fi

generate:
	cd internal/kernel && go generate ./...

# Caddy with rakelimit on the example config, run as root (loading BPF needs
# CAP_BPF and CAP_PERFMON).
run:
	@echo "building ./caddy (Caddy with rakelimit): the first build compiles Caddy and takes a few minutes; packages are listed as they compile"
	go build -v -o caddy ./cmd/caddy
	$(SUDO) ./caddy run --config testdata/Caddyfile

# Every test of the plugin's module, then of the lab's (lab/, a module of
# its own: benchmarks, simulator, charts); the test binaries run as root (BPF,
# network namespaces, dropping privileges). The race detector checks every
# package but the simulator, which starts no goroutine and runs six times
# slower under it.
TEST_EXEC = $(if $(SUDO),-exec '$(SUDO)' )
test: deps
	go test -race $(TEST_EXEC)./...
	cd lab && go test -race $(TEST_EXEC)$$(go list ./... | grep -v /sim$$)
	cd lab && go test $(TEST_EXEC)./sim

# The BPF program's tests (internal/kernel) under the kernels users run, each
# booted in QEMU (.ci/kernels.sh): Debian's 6.1, 6.12 and the newest the
# archive serves, and 5.10, which must refuse the program (the floor). The
# test binary is built as the caller; the script (apt, QEMU) runs as root.
# KERNELS and KERNEL_TESTS choose, e.g. KERNELS="6.1" KERNEL_TESTS=quick.
# Under QEMU's emulator (no usable KVM), all the tests take about 13 minutes,
# the quick set (which .ci/run runs) about 3.5.
test-kernels:
	@bin=$$(mktemp -d /tmp/rakelimit-kernel-test.XXXXXX)/kernel.test; \
	CGO_ENABLED=0 go test -c -o $$bin ./internal/kernel && \
	$(SUDO) env KERNEL_TEST_BIN=$$bin $(if $(KERNELS),KERNELS='$(KERNELS)') \
		$(if $(KERNEL_TESTS),KERNEL_TESTS='$(KERNEL_TESTS)') bash .ci/kernels.sh; \
	rc=$$?; rm -rf $$(dirname $$bin); exit $$rc

# The plugin against another quic-go than go.mod's (QUICGO, default the
# newest that Caddy 2.11.9 builds with; v0.65.0 removes an API Caddy
# imports), through a copy of go.mod (-modfile: the module's own is left
# alone): Caddy builds with it, and the tests of what the learner rests on
# (quic-go's 4-byte server IDs, its Initials' sizes, its resets and path
# probes, its batched reads and GSO through the conn) pass or fail by name.
QUICGO ?= v0.64.1
test-quicgo: deps
	@dir=$$(mktemp -d /tmp/rakelimit-quicgo.XXXXXX); cp go.mod go.sum $$dir/ && \
	go get -modfile=$$dir/go.mod github.com/quic-go/quic-go@$(QUICGO) && \
	go build -modfile=$$dir/go.mod -o $$dir/caddy ./cmd/caddy && \
	go test -modfile=$$dir/go.mod $(TEST_EXEC)-count=1 ./internal/packetconn/... ./internal/userspace; \
	rc=$$?; rm -rf $$dir; exit $$rc

# The fuzzing campaign: each target for FUZZTIME on one worker (the BPF
# one loads the filter; run as root), then the inputs tried and the
# divergences (failing inputs, written to the package's testdata/fuzz/).
# Minimization is kept short: the decision target is stateful, so a long
# minimization of each new input stalls it. Plain `go test` replays the
# committed corpus.
FUZZTIME ?= 60s
FUZZ_TARGETS = ./internal/decide/quicclass:FuzzClassifier ./internal/kernel:FuzzDecision
fuzz:
	@total=0; failed=0; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; out=$$(mktemp); \
		go test $(TEST_EXEC)-run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 100x -parallel 1 $$pkg >$$out 2>&1; \
		rc=$$?; execs=$$(grep -o 'execs: [0-9]*' $$out | tail -1 | cut -d' ' -f2); \
		div=0; if [ $$rc -ne 0 ]; then div=1; failed=1; tail -20 $$out; fi; \
		echo "$$fn ($$pkg): $${execs:-0} inputs in $(FUZZTIME), $$div divergences"; \
		total=$$((total + $${execs:-0})); rm -f $$out; \
	done; echo "fuzzing: $$total inputs tried"; exit $$failed

# The end-to-end benchmark: Caddy with and without rakelimit, every scenario,
# 3 repetitions; writes lab/docs/bench/ and the bench section of lab/README.md. About 20
# minutes. Built as the caller, run as root (BPF, floods from many loopback
# addresses). BENCHFLAGS adds flags, e.g. BENCHFLAGS="-variant 'strict=rakelimit 200'".
bench: deps
	go build -o caddy ./cmd/caddy
	cd lab && go build -o ../rakebench ./cmd/rakebench
	$(SUDO) ./rakebench -caddy ./caddy -out lab/docs/bench -readme lab/README.md $(BENCHFLAGS)

# Every scenario once and short (about 2.5 minutes), into a temporary
# directory: the smoke test .ci/run runs. It fails on a broken harness, not
# on figures.
bench-quick: deps
	go build -o caddy ./cmd/caddy
	cd lab && go build -o ../rakebench ./cmd/rakebench
	$(SUDO) ./rakebench -caddy ./caddy -scale 0.2 -transfer-scale 0.1 -reps 1 -out $$(mktemp -d /tmp/rakebench-quick.XXXXXX) $(BENCHFLAGS)

# The filter per packet against Cloudflare's rakelimit, side by side in one
# process through BPF_PROG_TEST_RUN: 15 interleaved rounds, medians, ratios
# in the same run; writes lab/docs/bench/filter.md. About a minute. Cloudflare's
# object is fetched from the Go module proxy the first time, into the cache
# directory of the user the program runs as (root), and never committed;
# BENCHFLAGS adds flags, e.g. BENCHFLAGS="-cloudflare ../rakelimit" for a
# copy of its repository.
bench-filter:
	cd lab && go build -o ../rakebench-filter ./cmd/rakebench-filter
	$(SUDO) ./rakebench-filter -out lab/docs/bench/filter.md $(BENCHFLAGS)

# Mode bpf against mode xdp: Caddy behind a veth between two network
# namespaces, floods at the sender's maximum, and a floor XDP program that only
# drops the flood: the least XDP costs on that path (lab/xdpbench).
bench-xdp:
	go build -o caddy ./cmd/caddy
	cd lab && go build -o ../rakebench-xdp ./cmd/rakebench-xdp
	$(SUDO) ./rakebench-xdp -caddy ./caddy -out lab/docs/bench/xdp $(BENCHFLAGS)

# The same on a real driver's ring: Caddy in a guest under QEMU (KVM where the
# host has kvm_intel or kvm_amd; the emulator elsewhere, where CPU per packet
# means nothing) with a virtio-net NIC on a tap in a namespace, flooded from
# the host; 1 vCPU, then 2 vCPUs with 1 and 2 queues (lab/virtiobench). The
# guest's kernel is Debian's (VIRTIO_KERNEL: a series, default 6.1, or newest),
# kept in .ci/kernels.sh's cache; both binaries are static, for the guest.
VIRTIO_KERNEL ?= 6.1
bench-virtio:
	CGO_ENABLED=0 go build -o caddy ./cmd/caddy
	cd lab && CGO_ENABLED=0 go build -o ../rakebench-virtio ./cmd/rakebench-virtio
	@kernel=$$($(SUDO) bash lab/cmd/rakebench-virtio/kernel.sh $(VIRTIO_KERNEL)) && \
	$(SUDO) ./rakebench-virtio -caddy ./caddy -kernel "$$kernel" -out lab/docs/bench/virtio $(BENCHFLAGS)
