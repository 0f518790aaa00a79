package prefilter

import (
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
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
	buf, netLen := datagram(p)
	ins := make([]bpf.Instruction, len(prog.Instructions))
	for i, in := range prog.Instructions {
		switch in := in.(type) {
		case bpf.LoadAbsolute:
			if in.Off >= skfNetOff {
				in.Off -= skfNetOff
			} else {
				in.Off += uint32(netLen)
			}
			ins[i] = in
		case bpf.LoadIndirect:
			in.Off += uint32(netLen)
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

// datagram is p as the VM reads it: its network header (IPv4, 20 bytes, or
// IPv6, 40, to the loopback address; one zero byte with noNetHeader), of
// netLen bytes, then the UDP header and the payload.
func datagram(p packet) (b []byte, netLen int) {
	src := p.src.Addr().Unmap()
	dst, netLen := netip.IPv6Loopback(), testutil.IPv6HdrLen
	if src.Is4() {
		dst, netLen = netip.AddrFrom4([4]byte{127, 0, 0, 1}), testutil.IPv4HdrLen
	}
	b = testutil.Frame{Src: src, Dst: dst, SrcPort: p.src.Port(), DstPort: p.dport, Data: p.payload}.Bytes()[testutil.EthHdrLen:]
	if p.noNetHeader {
		return append([]byte{0x00}, b[netLen:]...), 1
	}
	return b, netLen
}
