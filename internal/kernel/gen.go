package kernel

// The generated rakelimit_bpf{el,eb}.{go,o} are committed: building the module
// needs no clang. Regenerate with `make generate` (which pins the compiler)
// after changing rakelimit.c or a header in c/; CI fails when the committed
// files are stale. c/contract.h is generated first, from the Go constants
// marked "C: NAME" in the packages listed (internal/cgen).
// Headers come from Debian's libbpf-dev and linux-libc-dev.
//go:generate go run ./internal/cgen -o c/contract.h ../decide/quicclass ../decide/sketch ../decide .
//go:generate go tool bpf2go -cc ${BPF_CLANG} -cflags ${BPF_CFLAGS} -tags linux -type line -type config -type stats -type fair -type verdict -type stream_key -type stream_state -type allow4_key -type allow6_key -type learned_set -type listen_table -type listen_key rakelimit rakelimit.c -- -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
