//go:build linux

package xdpbench

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// ModeFloor is the floor the XDP program is measured against: Caddy in
// mode bpf behind a trivial XDP program (FloorProgram) that drops every
// frame from the flood's /48 and passes the rest. Its receiving CPU per
// drop is what the veth and XDP itself cost per frame, whatever a program
// decides: the least any XDP program can cost on this path.
const ModeFloor = "xdp-floor"

// Offsets in an Ethernet frame of an IPv6 packet, and the flood's /48
// (FloodPrefix, FloodSource) as the program reads it: a 32-bit load
// of the source's first 4 bytes and a 16-bit load of the next 2, in the
// machine's byte order (little-endian, x86 and arm64).
const (
	ethProtoOff  = 12
	ipv6SrcOff   = 14 + 8
	floorMinLen  = ipv6SrcOff + 6
	ethP6LE      = 0xdd86     // ETH_P_IPV6 (0x86dd) as loaded
	floodWord0LE = 0x780000fd // fd 00 00 78
	floodHalf1LE = 0xb000     // 00 b0
)

// FloorProgram returns the floor's XDP program: XDP_DROP for an IPv6
// frame from the flood's /48, XDP_PASS for any other (the legit client's
// and Caddy's neighbour discovery among them).
func FloorProgram() (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xdp_floor_drop",
		Type:    ebpf.XDP,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // xdp_md.data
			asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // xdp_md.data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, floorMinLen),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R5, asm.R2, ethProtoOff, asm.Half),
			asm.JNE.Imm(asm.R5, ethP6LE, "pass"),
			asm.LoadMem(asm.R5, asm.R2, ipv6SrcOff, asm.Word),
			asm.JNE.Imm32(asm.R5, floodWord0LE, "pass"),
			asm.LoadMem(asm.R5, asm.R2, ipv6SrcOff+4, asm.Half),
			asm.JNE.Imm(asm.R5, floodHalf1LE, "pass"),
			asm.Mov.Imm(asm.R0, 1), // XDP_DROP
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("pass"), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the floor's XDP program: %w", err)
	}
	return prog, nil
}

// Floor is the floor's program attached to an interface; its run count
// (the kernel's program statistics, which must be on: ebpf.EnableStats)
// is the floor's drops.
type Floor struct {
	prog *ebpf.Program
	link link.Link
}

// AttachFloor loads the floor's program and attaches it natively (in the
// driver) to the interface ifname of the calling thread's namespace.
func AttachFloor(ifname string) (*Floor, error) {
	f := &Floor{}
	var err error
	if f.prog, err = FloorProgram(); err != nil {
		return nil, err
	}
	iface, err := net.InterfaceByName(ifname)
	if err == nil {
		f.link, err = link.AttachXDP(link.XDPOptions{Program: f.prog, Interface: iface.Index, Flags: link.XDPDriverMode})
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attaching the floor's XDP program to %s: %w", ifname, err)
	}
	return f, nil
}

// attachFloor attaches the floor's program to the veth in the server's
// namespace.
func (l *lab) attachFloor() (*Floor, error) {
	var f *Floor
	err := l.server.Enter(func() error {
		var err error
		f, err = AttachFloor(vethName)
		return err
	})
	return f, err
}

// Runs is how many frames the floor's program saw; all but the legit
// client's few and neighbour discovery are the flood's, which it dropped.
func (f *Floor) Runs() (uint64, error) {
	st, err := f.prog.Stats()
	if err != nil {
		return 0, fmt.Errorf("the floor's program statistics: %w", err)
	}
	return st.RunCount, nil
}

// ProgramRuns sums the run counts of the loaded BPF programs named name
// (the kernel's program statistics: on while a floor is attached, or
// enableStats): how many frames the XDP program of a Caddy in mode xdp ran
// on.
func ProgramRuns(name string) (uint64, error) {
	var sum uint64
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return sum, nil
		}
		if err != nil {
			return 0, fmt.Errorf("listing BPF programs: %w", err)
		}
		id = next
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := prog.Info()
		if err == nil && info.Name == name {
			var st *ebpf.ProgramStats
			if st, err = prog.Stats(); err == nil {
				sum += st.RunCount
			}
		}
		prog.Close()
		if err != nil {
			return 0, fmt.Errorf("BPF program %d: %w", id, err)
		}
	}
}

// Close detaches and unloads the floor's program.
func (f *Floor) Close() {
	if f.link != nil {
		f.link.Close()
	}
	if f.prog != nil {
		f.prog.Close()
	}
}
