//go:build linux

package kernel

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// ipv4Total is the IP datagram of the length trick: an IP total length of
// 1228, of which the UDP datagram claims only udpClaim bytes.
const (
	ipv4Total = 1228
	udpClaim  = 48
)

// lengthCases are datagrams whose IP and UDP lengths disagree; the payload
// a socket receives is the UDP length's (less the header), whatever the IP
// datagram holds after it.
func lengthCases() []struct {
	name   string
	data   []byte
	udpLen int
	class  quicclass.Class
	reason quicclass.Reason
} {
	head := func(v uint32) []byte {
		b := quicclasstest.LongHeader(v, 0, 8, 8, ipv4Total-testutil.IPv4HdrLen-testutil.UDPHdrLen)
		return b
	}
	return []struct {
		name   string
		data   []byte
		udpLen int
		class  quicclass.Class
		reason quicclass.Reason
	}{
		{"40-byte initial in a 1228-byte ip datagram", head(quicclass.Version1), udpClaim, quicclass.Invalid, quicclass.SmallInitial},
		{"40-byte unknown version in a 1228-byte ip datagram", head(0x0a0a0a0a), udpClaim, quicclass.Invalid,
			quicclass.SmallUnknownVersion},
		{"consistent initial", head(quicclass.Version1), 0, quicclass.Opening, 0},
		{"udp length of the header alone", head(quicclass.Version1), testutil.UDPHdrLen, quicclass.Invalid, quicclass.Empty},
		{"udp length under the header", head(quicclass.Version1), 3, quicclass.Invalid, quicclass.Empty},
		{"udp length past the ip datagram", quicclasstest.ShortHeader(100), 1000, quicclass.Established, 0},
	}
}

// TestDifferentialLengths: the program and the Go twin give a datagram the
// length a UDP socket receives, its UDP length's, not its IP datagram's:
// an Initial of 40 bytes in an IPv4 datagram of 1228 is a small Initial,
// not an opening, and an unknown version a small one, not a negotiation.
// The frames go through BPF_PROG_TEST_RUN, the twin reads what a socket
// would receive, and decide.Parse reads the frame as the program does.
func TestDifferentialLengths(t *testing.T) {
	w := newTwin(t, testutil.QUICLimits(1000, 1000))
	now := start
	for _, src := range []string{"198.51.100.7", "2001:db8::7"} {
		for _, tt := range lengthCases() {
			t.Run(src+" "+tt.name, func(t *testing.T) {
				w.t = t
				p := udp(src, 50000)
				p.Data, p.UDPLen = tt.data, tt.udpLen
				now += int64(time.Millisecond)
				d := p.Datagram(true)
				if tt.udpLen == 1000 { // bounded by the IP datagram
					d = decide.Datagram{Key: p.Key(true), Length: len(tt.data), Probe: tt.data}
				}
				if got := decide.Parse(p.Bytes()[testutil.EthHdrLen:], p.Src.Is6()); !sameDatagram(got, d) {
					t.Fatalf("decide.Parse read %d bytes, want %d", got.Length, d.Length)
				}
				out := w.step(p, d, now, 0)
				if out.Class != tt.class || out.Reason != tt.reason {
					t.Fatalf("class %v/%v, want %v/%v", out.Class, out.Reason, tt.class, tt.reason)
				}
			})
		}
	}
	w.t = t
	w.compareState()
}

// TestSocketLengths sends the length trick to a real socket from a raw
// socket (IPv4, loopback): datagrams of 1228 IP bytes whose UDP length is
// 48, carrying the first 40 bytes of an Initial and of an unknown version,
// and a consistent Initial beside them. The kernel trims each to its UDP
// length before the filter runs; in a dry run the filter delivers them, and
// its counters must be those of the Go twin run on the bytes the socket
// received: a small Initial and a small unknown version, both invalid.
func TestSocketLengths(t *testing.T) {
	c := testutil.QUICLimits(1000, 1000)
	c.DryRun = true
	f, conn, port := attached(t, c, "udp4")
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer unix.Close(fd)
	src := netip.MustParseAddrPort("127.0.0.21:50021")
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	cases := lengthCases()[:3]
	for _, tt := range cases {
		udpLen := tt.udpLen
		if udpLen == 0 {
			udpLen = ipv4Total - testutil.IPv4HdrLen
		}
		// An IP datagram of ipv4Total bytes whose payload starts with
		// tt.data (the kernel fills in the IP checksum again).
		data := make([]byte, ipv4Total-testutil.IPv4HdrLen-testutil.UDPHdrLen)
		copy(data, tt.data)
		b := testutil.Frame{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), Data: data,
			UDPLen: udpLen}.Bytes()[testutil.EthHdrLen:]
		if err := unix.Sendto(fd, b, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
			t.Fatalf("sending %s: %v", tt.name, err)
		}
	}
	twin, err := decide.New(c, sketch.SeededHashKey(1))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for i, tt := range cases {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("received %d of %d datagrams: %v", i, len(cases), err)
		}
		if from != src {
			t.Fatalf("datagram from %v, want %v", from, src)
		}
		d := decide.Datagram{Key: sketch.KeyFrom(from, port), Length: n, Probe: buf[:n]}
		out := twin.Decide(&d, start+int64(i), 0)
		if out.Class != tt.class || out.Reason != tt.reason {
			t.Errorf("%s: received %d bytes, the twin says %v/%v, want %v/%v", tt.name, n, out.Class, out.Reason,
				tt.class, tt.reason)
		}
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if want := twin.Stats(); st != want {
		t.Fatalf("kernel counters %+v, the twin's on the received bytes %+v", st, want)
	}
}

// TestSocketAllowlistValidity: on a real socket, an allowlisted source's
// invalid datagrams are dropped and counted as invalid: not QUIC (fixed bit
// 0), a small unknown version, from a reflection port; its Initial alone is
// delivered, counted as allowed.
func TestSocketAllowlistValidity(t *testing.T) {
	c := testutil.QUICLimits(1000, 1000)
	c.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	f, conn, port := attached(t, c, "udp4")
	src := netip.MustParseAddr("127.0.0.22")
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	r := testutil.Receive(conn)
	sends := []struct {
		sport uint16
		data  []byte
	}{
		{50022, quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)},
		{50022, make([]byte, 64)},
		{50022, quicclasstest.LongHeader(0x0a0a0a0a, 0, 8, 8, 300)},
		{3702, quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)}, // WS-Discovery, a reflection port
	}
	senders := map[uint16]*net.UDPConn{}
	for _, s := range sends {
		if senders[s.sport] == nil {
			senders[s.sport] = testutil.Sender(t, netip.AddrPortFrom(src, s.sport))
		}
		if _, err := senders[s.sport].WriteToUDPAddrPort(s.data, dst); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	var st decide.Stats
	fam := decide.FamilyIndex(sketch.IPv4)
	for {
		var err error
		if st, err = f.Stats(); err != nil {
			t.Fatal(err)
		}
		var invalid uint64
		for _, n := range st.Invalid[0][fam] {
			invalid += n
		}
		if st.Allowed[fam]+invalid >= uint64(len(sends)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	r.Stop(t)
	inv := st.Invalid[0][fam]
	if got := r.ReceivedFrom(src); got != 1 || st.Allowed[fam] != 1 || inv[quicclass.FixedBit] != 1 ||
		inv[quicclass.SmallUnknownVersion] != 1 || inv[quicclass.SourcePort] != 1 {
		t.Fatalf("delivered %d of %d, counted %d allowed and invalid %v; want the Initial alone delivered and allowed, "+
			"one invalid of each reason", got, len(sends), st.Allowed[fam], inv)
	}
}

// TestDifferentialVarintsAcrossProbe: an Initial's token length and Length
// field are read from the probe when it holds them and loaded from the
// packet past it; connection ID lengths from 0 to 20 and every varint size
// put the fields before, across and after the probe's end, and the program
// and the Go twin classify each Initial alike: a consistent Length passes
// it as opening, one past the datagram makes it invalid (length).
func TestDifferentialVarintsAcrossProbe(t *testing.T) {
	c := testutil.QUICLimits(1000, 1000)
	c.VerifyIDs = true // lengths are checked only when verifying
	w := newTwin(t, c)
	now := start
	const size = 1200
	varint := func(b []byte, n int, v uint64) []byte {
		for i := n - 1; i >= 0; i-- {
			b = append(b, byte(v>>(8*i)))
		}
		b[len(b)-n] |= byte(bits.Len(uint(n))-1) << 6
		return b
	}
	sizes := []int{1, 2, 4, 8}
	for _, cil := range []int{0, 4, 8, 12, 16, 20} {
		for _, tokenSize := range sizes {
			for _, lengthSize := range sizes[1:] { // a Length of about 1,150 needs 2 bytes
				for _, past := range []bool{false, true} {
					b := binary.BigEndian.AppendUint32([]byte{0xc0}, quicclass.Version1) // an Initial
					b = append(b, byte(cil))
					b = append(b, make([]byte, cil)...)
					b = append(b, byte(cil))
					b = append(b, make([]byte, cil)...)
					b = varint(b, tokenSize, 0)
					rest := uint64(size - len(b) - lengthSize)
					if past {
						rest++
					}
					b = varint(b, lengthSize, rest)
					b = append(b, make([]byte, size-len(b))...)
					want, reason := quicclass.Opening, quicclass.NotInvalid
					if past {
						want, reason = quicclass.Invalid, quicclass.Length
					}
					name := fmt.Sprintf("cid %d token varint %d length varint %d past %v", cil, tokenSize, lengthSize, past)
					t.Run(name, func(t *testing.T) {
						w.t = t
						p := udp("198.51.100.9", 50000)
						p.Data = b
						now += int64(time.Millisecond)
						out := w.step(p, p.Datagram(true), now, 0)
						if out.Class != want || out.Reason != reason {
							t.Fatalf("class %v/%v, want %v/%v", out.Class, out.Reason, want, reason)
						}
					})
				}
			}
		}
	}
	w.t = t
	w.compareState()
}
