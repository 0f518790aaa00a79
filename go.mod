module github.com/rakelimit/caddy-rakelimit

go 1.26.8

tool github.com/cilium/ebpf/cmd/bpf2go

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.43.0
)
