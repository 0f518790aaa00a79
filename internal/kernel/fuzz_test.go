//go:build linux

package kernel

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// fuzzMaxFrame bounds the fuzzed packets: a datagram on an Ethernet link,
// and under what BPF_PROG_TEST_RUN takes.
const fuzzMaxFrame = 1500

// tryRun is run for fuzzing: it reports the kernel's refusal of a frame
// (err) instead of failing, and the verdict.
func (f *Program) tryRun(frame []byte, now int64, rnd uint32) (rakelimitVerdict, uint32, error) {
	ctx := skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), rnd}}
	ret, err := runOnTestCPU(f.objs.Rakelimit, &ebpf.RunOptions{Data: frame, Context: ctx})
	if err != nil {
		return rakelimitVerdict{}, 0, err
	}
	var v rakelimitVerdict
	err = f.objs.TestVerdict.Lookup(uint32(0), &v)
	return v, ret, err
}

// fuzzSeeds are the packets the decision fuzzer starts from: every kind of
// datagram the classifier tells apart, from IPv4 (with options, fragments)
// and IPv6 (with extension headers), lengths that disagree, and not UDP.
func fuzzSeeds() []testutil.Frame {
	rng := rand.New(rand.NewPCG(1, 2))
	var seeds []testutil.Frame
	sid := []byte{0xa1, 0xb2, 0xc3, 0xd4}
	extra := [][]byte{
		quicclasstest.LongPacket(quicclass.Version1, 0, sid, []byte{1, 2, 3, 4, 5, 6, 7, 8}, make([]byte, 30), 1200),
		quicclasstest.LongPacket(quicclass.Version1, 2, sid, nil, nil, 90),
		quicclasstest.ShortPacket([4]byte(sid), 40),
	}
	for i, data := range append(quicPayloads(rng), extra...) {
		for _, src := range []string{"203.0.113.7", "2001:db8:77::7"} {
			p := udp(src, uint16(50000+i))
			p.Data = data
			seeds = append(seeds, p)
		}
		if i%3 == 0 {
			p := udp("198.51.100.9", 53)
			p.Data = data
			seeds = append(seeds, p)
		}
	}
	v6, v4 := udp("2001:db8::9", 50000), udp("198.51.100.9", 50000)
	v6.Data = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	v6.IPv6Ext = []testutil.IPv6Ext{{Kind: unix.IPPROTO_HOPOPTS}, {Kind: unix.IPPROTO_ROUTING, Units: 1},
		{Kind: unix.IPPROTO_FRAGMENT}, {Kind: unix.IPPROTO_AH, Units: 2}, {Kind: unix.IPPROTO_DSTOPTS}}
	seeds = append(seeds, v6)
	v4.Data, v4.IPv4Options = quicclasstest.ShortHeader(50), 3
	seeds = append(seeds, v4)
	trick := udp("198.51.100.10", 50000)
	trick.Data, trick.UDPLen = quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200), udpClaim
	seeds = append(seeds, trick)
	tcp := udp("198.51.100.11", 50000)
	tcp.Proto = unix.IPPROTO_TCP
	return append(seeds, tcp)
}

// FuzzDecision runs the BPF program under BPF_PROG_TEST_RUN (the socket
// filter, and the path of mode xdp: see twin) and the Go twin on
// network-layer packets of any bytes and length, read as IPv4 or
// IPv6 (the frame's ethertype), and fails at the first divergence of
// verdict, class, reason, verification, allowlisting, pacing or limiter
// verdict; every 500 inputs the counters, sketches, fair shares, pacer and
// learned state too. The twin reads the packet with decide.Parse. Two
// configurations: classification alone, and with connection ID verification
// (a learned server ID and peer) and an allowlist. A frame the kernel
// refuses is skipped by both.
func FuzzDecision(f *testing.F) {
	for _, p := range fuzzSeeds() {
		fr := p.Bytes()
		f.Add(fr[testutil.EthHdrLen:], p.Src.Is6(), uint32(len(fr)))
	}
	plain := testutil.QUICLimits(50, 200)
	verify := testutil.QUICLimits(50, 200)
	verify.VerifyIDs = true
	verify.Allow = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("2001:db8:77::/64")}
	now := start
	twins := []*twin{newTwin(f, plain), newTwin(f, verify)}
	for _, a := range []string{"203.0.113.7", "2001:db8:77::7"} {
		twins[1].learnID(decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}, netip.MustParseAddr(a), now)
		twins[1].learnPeer(netip.MustParseAddr(a), now)
	}
	twins[1].learnPeer(netip.MustParseAddr("203.0.113.8"), now)
	f.Fuzz(func(t *testing.T, ip []byte, ipv6 bool, rnd uint32) {
		if len(ip)+testutil.EthHdrLen > fuzzMaxFrame {
			return
		}
		frame := make([]byte, testutil.EthHdrLen, testutil.EthHdrLen+len(ip))
		binary.BigEndian.PutUint16(frame[12:], unix.ETH_P_IP)
		if ipv6 {
			binary.BigEndian.PutUint16(frame[12:], unix.ETH_P_IPV6)
		}
		frame = append(frame, ip...)
		now += int64(time.Millisecond) / 4
		for _, w := range twins {
			w.t = t
			got, ret, err := w.f.tryRun(frame, now, rnd)
			if err != nil {
				continue // the kernel refused the frame: nothing happened
			}
			d := decide.Parse(ip, ipv6)
			want := w.d.Decide(&d, now, rnd)
			w.packet++
			if !sameVerdict(got, want) || (ret == 0) != (got.Drop == 1) {
				t.Fatalf("packet %d (%d bytes, ipv6 %v, read %+v): BPF %+v (returned %d), Go %+v", w.packet, len(ip), ipv6,
					d, got, ret, want)
			}
			if x := w.x.runPath(t, frame, now, rnd); !sameVerdict(x.v, want) {
				t.Fatalf("packet %d (%d bytes, ipv6 %v, read %+v): mode xdp (decided by %s): BPF %+v, Go %+v",
					w.packet, len(ip), ipv6, d, x.by, x.v, want)
			}
			if w.packet%500 == 0 {
				w.compareState()
			}
		}
	})
}
