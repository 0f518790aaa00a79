//go:build linux

package kernel

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// BenchOptions choose what a filter loaded for a benchmark through
// BPF_PROG_TEST_RUN (LoadBench) loads.
type BenchOptions struct {
	// RandomSource gives every packet a new random source address, so
	// that one packet repeated by BPF_PROG_TEST_RUN is a packet from a new
	// source every time: the filter loads the object's benchmark entries
	// (rakelimit_bench_random, rakelimit_xdp_bench_random; see
	// c/pkt.h) in place of the production ones, which it loads otherwise.
	RandomSource bool
	// XDP loads the XDP program too (XDPProgram).
	XDP bool
}

// LoadBench loads the filter as Load does, with the programs o chooses. A
// filter loaded with RandomSource must never be attached to a socket: it
// limits no one.
func LoadBench(c decide.Config, o BenchOptions) (*Program, error) {
	return load(c, loadOptions{benchRandomSource: o.RandomSource, xdp: o.XDP})
}

// ProveForBench makes addr an answered peer and a proven one, as the
// program makes an answered peer that sends back a server ID bound to it
// (and as a benchmark's first datagram through BPF_PROG_TEST_RUN would,
// were it a Handshake packet). Only for a filter loaded with LoadBench.
func (f *Program) ProveForBench(addr netip.Addr) error {
	if err := f.LearnPeer(addr); err != nil {
		return err
	}
	pk, err := decide.PeerKeyOf(addr)
	if err != nil {
		return err
	}
	f.learned.Proven.Learn(decide.PeerHash(&f.hk, &pk), decide.Stamp(int64(monoNow())))
	return nil
}

// Program returns the filter's socket filter program (the benchmark entry
// for a filter that LoadBench loaded with RandomSource), for
// BPF_PROG_TEST_RUN. It stays owned by the filter: Close closes it.
func (f *Program) Program() *ebpf.Program {
	return f.objs.Rakelimit
}

// XDPFloorProgram loads a trivial XDP program that passes every frame: the
// cost of BPF_PROG_TEST_RUN of an XDP program, against which the XDP
// program is measured. The caller closes it.
func XDPFloorProgram() (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xdp_floor",
		Type:    ebpf.XDP,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.LoadImm(asm.R0, 2, asm.DWord), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the XDP floor program: %w", err)
	}
	return prog, nil
}

// FloorProgram loads a trivial socket filter that returns the packet
// length: the cost of BPF_PROG_TEST_RUN itself, against which the filter
// is measured. The caller closes it.
func FloorProgram() (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "floor",
		Type:    ebpf.SocketFilter,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R0, asm.R1, 0, asm.Word), // skb->len
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the floor program: %w", err)
	}
	return prog, nil
}
