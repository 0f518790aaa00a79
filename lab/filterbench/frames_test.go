package filterbench

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// frameSource returns the source address of an IPv4 or IPv6 frame.
func frameSource(f []byte) netip.Addr {
	ip := f[testutil.EthHdrLen:]
	if ip[0]>>4 == 4 {
		return netip.AddrFrom4([4]byte(ip[12:16]))
	}
	return netip.AddrFrom16([16]byte(ip[8:24]))
}

func TestFrame(t *testing.T) {
	for _, tt := range []struct {
		name          string
		ipv6          bool
		payload       int
		wantLen       int
		wantEtherType uint16
	}{
		// The 1,228-byte IPv4 packet: a 1,200-byte Initial.
		{"IPv4 Initial", false, initialSize, testutil.EthHdrLen + 1228, testutil.EtherTypeIPv4},
		{"IPv6 Initial", true, initialSize, testutil.EthHdrLen + 1248, testutil.EtherTypeIPv6},
		{"IPv4 junk", false, junkSize, testutil.EthHdrLen + 128, testutil.EtherTypeIPv4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := caseSpec{ipv6: tt.ipv6, payload: make([]byte, tt.payload)}
			f := c.frame()
			if len(f) != tt.wantLen {
				t.Fatalf("frame of %d bytes, want %d", len(f), tt.wantLen)
			}
			if et := binary.BigEndian.Uint16(f[12:]); et != tt.wantEtherType {
				t.Errorf("ethertype %#x, want %#x", et, tt.wantEtherType)
			}
			ip := f[testutil.EthHdrLen:]
			var udp []byte
			if tt.ipv6 {
				if ip[6] != testutil.ProtoUDP || int(binary.BigEndian.Uint16(ip[4:])) != testutil.UDPHdrLen+tt.payload {
					t.Errorf("IPv6 next header %d, payload length %d", ip[6], binary.BigEndian.Uint16(ip[4:]))
				}
				udp = ip[testutil.IPv6HdrLen:]
			} else {
				if ip[9] != testutil.ProtoUDP || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
					t.Errorf("IPv4 protocol %d, total length %d of %d", ip[9], binary.BigEndian.Uint16(ip[2:]), len(ip))
				}
				if testutil.IPv4Checksum(ip[:testutil.IPv4HdrLen]) != 0 {
					t.Errorf("IPv4 header checksum does not verify")
				}
				udp = ip[testutil.IPv4HdrLen:]
			}
			if sp, dp := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]); sp != srcPort || dp != dstPort {
				t.Errorf("ports %d -> %d, want %d -> %d", sp, dp, srcPort, dstPort)
			}
			if got, want := frameSource(f), srcIPv4; !tt.ipv6 && got != want {
				t.Errorf("source %v, want %v", got, want)
			}
		})
	}
}

// framePort is the UDP source port of frame f.
func framePort(f []byte, ipv6 bool) uint16 {
	return binary.BigEndian.Uint16(f[testutil.UDPOffset(ipv6):])
}

func TestRandomFrames(t *testing.T) {
	for _, tt := range []struct{ ipv6, ports bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		ipv6 := tt.ipv6
		c := caseSpec{ipv6: ipv6, payload: make([]byte, initialSize)}
		base := c.frame()
		frames := randomFrames(base, ipv6, tt.ports, 1000, rand.New(rand.NewPCG(1, 2)))
		seen := map[netip.Addr]bool{}
		ports := map[uint16]bool{}
		for _, f := range frames {
			src := frameSource(f)
			seen[src] = true
			p := framePort(f, ipv6)
			ports[p] = true
			if tt.ports && p < 1024 {
				t.Errorf("source port %d, want 1024 or above", p)
			}
			if len(f) != len(base) {
				t.Fatalf("frame of %d bytes, want %d", len(f), len(base))
			}
			if ipv6 {
				if !src.Is6() || src.As16()[0]>>5 != 1 {
					t.Errorf("IPv6 source %v outside 2000::/3", src)
				}
				continue
			}
			if a := src.As4(); !src.Is4() || a[0] == 0 || a[0] == 127 || a[0] >= 224 {
				t.Errorf("IPv4 source %v: want unicast outside 0/8 and 127/8", src)
			}
			if testutil.IPv4Checksum(f[testutil.EthHdrLen:testutil.EthHdrLen+testutil.IPv4HdrLen]) != 0 {
				t.Errorf("IPv4 checksum of the frame from %v does not verify", src)
			}
		}
		// 1,000 draws from 2^32 or more: a repeat means the sources
		// are not random.
		if len(seen) != len(frames) {
			t.Errorf("ipv6=%v: %d distinct sources in %d frames", ipv6, len(seen), len(frames))
		}
		// 1,000 draws from 64,512 ports: about 992 distinct.
		ok := len(ports) == 1 && ports[framePort(base, ipv6)]
		if tt.ports {
			ok = len(ports) > 950
		}
		if !ok {
			t.Errorf("ipv6=%v ports=%v: %d distinct source ports in %d frames", ipv6, tt.ports, len(ports), len(frames))
		}
		if frameSource(base) != map[bool]netip.Addr{false: srcIPv4, true: srcIPv6}[ipv6] {
			t.Errorf("randomFrames changed the frame it copies")
		}
	}
}
