package prefilter

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"
)

// packet is a datagram as the kernel shows it to a UDP socket's filter.
type packet struct {
	src         netip.AddrPort
	dport       uint16
	payload     []byte
	rnd         uint32
	noNetHeader bool
}

// run runs prog in x/net/bpf's VM on p and reports whether it keeps p. The
// VM lacks the kernel's extensions, so the program is rewritten for the
// packet: the buffer holds the network header, then the UDP header and the
// payload; loads relative to SKF_NET_OFF read the network header, other
// absolute and indirect loads are moved past it, and the length and random
// extensions become constants (the UDP datagram's length, p.rnd).
func run(t testing.TB, prog *Program, p packet) bool {
	t.Helper()
	net := netHeader(p)
	buf := append([]byte(nil), net...)
	buf = binary.BigEndian.AppendUint16(buf, p.src.Port())
	buf = binary.BigEndian.AppendUint16(buf, p.dport)
	buf = binary.BigEndian.AppendUint16(buf, uint16(udpHeaderLen+len(p.payload)))
	buf = append(buf, 0, 0)
	buf = append(buf, p.payload...)
	ins := make([]bpf.Instruction, len(prog.Instructions))
	for i, in := range prog.Instructions {
		switch in := in.(type) {
		case bpf.LoadAbsolute:
			if in.Off >= skfNetOff {
				in.Off -= skfNetOff
			} else {
				in.Off += uint32(len(net))
			}
			ins[i] = in
		case bpf.LoadIndirect:
			in.Off += uint32(len(net))
			ins[i] = in
		case bpf.LoadExtension:
			switch in.Num {
			case bpf.ExtLen:
				ins[i] = bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(udpHeaderLen + len(p.payload))}
			case bpf.ExtRand:
				ins[i] = bpf.LoadConstant{Dst: bpf.RegA, Val: p.rnd}
			default:
				t.Fatalf("instruction %d: extension %v the test cannot emulate", i, in.Num)
			}
		default:
			ins[i] = in
		}
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatalf("the VM refuses the program: %v", err)
	}
	n, err := vm.Run(buf)
	if err != nil {
		t.Fatalf("running the program: %v", err)
	}
	return n != 0
}

// netHeader is the network header of p: IPv4 (20 bytes) or IPv6 (40).
func netHeader(p packet) []byte {
	if p.noNetHeader {
		return []byte{0x00}
	}
	a := p.src.Addr().Unmap()
	if a.Is4() {
		h := make([]byte, 20)
		h[0] = 0x45
		h[9] = 17
		s := a.As4()
		copy(h[12:], s[:])
		copy(h[16:], []byte{127, 0, 0, 1})
		return h
	}
	h := make([]byte, 40)
	h[0] = 0x60
	h[6] = 17
	s := a.As16()
	copy(h[8:], s[:])
	h[39] = 1
	return h
}
