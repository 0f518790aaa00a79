package prefilter

import (
	"encoding/binary"
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

// run runs prog in x/net/bpf's VM on p and reports whether it keeps p
// (runner).
func run(t testing.TB, prog *Program, p packet) bool {
	t.Helper()
	return runner(t, prog, p)(p.rnd)
}

// rndLen is the room the VM's buffer keeps for the random number, before
// the packet.
const rndLen = 4

// runner returns run of prog on p with the random number it is given, the
// VM made once. The VM lacks the kernel's extensions, so the program is
// rewritten for the packet: the buffer holds the random number, then the
// network header, then the UDP header and the payload; loads relative to
// SKF_NET_OFF read the network header, other absolute and indirect loads
// are moved past it, the length extension becomes a constant (the UDP
// datagram's length) and the random one a load of the number.
func runner(t testing.TB, prog *Program, p packet) func(rnd uint32) bool {
	t.Helper()
	d, netLen := datagram(p)
	buf := append(make([]byte, rndLen), d...)
	ins := make([]bpf.Instruction, len(prog.Instructions))
	for i, in := range prog.Instructions {
		switch in := in.(type) {
		case bpf.LoadAbsolute:
			if in.Off >= skfNetOff {
				in.Off -= skfNetOff
			} else {
				in.Off += uint32(netLen)
			}
			in.Off += rndLen
			ins[i] = in
		case bpf.LoadIndirect:
			in.Off += uint32(rndLen + netLen)
			ins[i] = in
		case bpf.LoadExtension:
			switch in.Num {
			case bpf.ExtLen:
				ins[i] = bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(udpHeaderLen + len(p.payload))}
			case bpf.ExtRand:
				ins[i] = bpf.LoadAbsolute{Off: 0, Size: rndLen}
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
	return func(rnd uint32) bool {
		t.Helper()
		binary.BigEndian.PutUint32(buf, rnd)
		n, err := vm.Run(buf)
		if err != nil {
			t.Fatalf("running the program: %v", err)
		}
		return n != 0
	}
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
