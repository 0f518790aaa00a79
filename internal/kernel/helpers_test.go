//go:build linux

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// loadTest loads a filter for a test and closes it when the test ends. It
// skips (or, in CI, fails) when the process may not load BPF.
func loadTest(t testing.TB, c decide.Config, o loadOptions) *Filter {
	t.Helper()
	if o.hashKey == nil {
		hk := sketch.SeededHashKey(1)
		o.hashKey = &hk
	}
	f, err := load(c, o)
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("load: %+v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// skbContext is the head of struct __sk_buff up to cb[], the part that
// BPF_PROG_TEST_RUN lets a test set.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
}

// run feeds one frame to a test-mode filter at time now with random number
// rnd and returns the program's verdict.
func (f *Filter) run(t testing.TB, frame []byte, now int64, rnd uint32) rakelimitVerdict {
	t.Helper()
	ctx := skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), rnd}}
	ret, err := runOnTestCPU(f.objs.Rakelimit, &ebpf.RunOptions{Data: frame, Context: ctx})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	var v rakelimitVerdict
	if err := f.objs.TestVerdict.Lookup(uint32(0), &v); err != nil {
		t.Fatalf("reading verdict: %v", err)
	}
	if dropped := ret == 0; dropped != (v.Drop == 1 && !f.Config().DryRun) {
		t.Fatalf("program returned %d but recorded drop=%d", ret, v.Drop)
	}
	return v
}

// testCPU is the CPU the tests run the program on: the first this process
// may use. The program keeps state per CPU (the socket total's pending
// counts, the fair shares), which the Go twin, one CPU, mirrors for the CPU
// it runs on. The mask is the main thread's (the process's id): a thread
// the runtime starts while another is pinned by runOnCPU inherits that pin
// for good, so the calling thread's mask would name another CPU.
func testCPU() (int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(os.Getpid(), &set); err != nil {
		return 0, fmt.Errorf("reading the CPU affinity: %w", err)
	}
	for cpu := range 1 << 10 {
		if set.IsSet(cpu) {
			return cpu, nil
		}
	}
	return 0, errors.New("no CPU in the affinity mask")
}

// runOnTestCPU runs prog once on testCPU.
func runOnTestCPU(prog *ebpf.Program, opts *ebpf.RunOptions) (uint32, error) {
	cpu, err := testCPU()
	if err != nil {
		return 0, err
	}
	return runOnCPU(prog, opts, cpu)
}

// runOnCPU runs prog once on CPU cpu: the calling goroutine's thread is
// pinned there for the run, and given back its mask after.
func runOnCPU(prog *ebpf.Program, opts *ebpf.RunOptions, cpu int) (uint32, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		return 0, fmt.Errorf("reading the CPU affinity: %w", err)
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return 0, fmt.Errorf("pinning to CPU %d: %w", cpu, err)
	}
	defer unix.SchedSetaffinity(0, &was)
	return prog.Run(opts)
}

// pending reads the socket total's pending counts of testCPU, as the Go
// twin's sketch.Limiter.Pending gives them.
func (f *Filter) pending(t testing.TB) [sketch.NumClasses]sketch.Cell {
	t.Helper()
	cpu, err := testCPU()
	if err != nil {
		t.Fatal(err)
	}
	return f.pendingOf(t, cpu)
}

// pendingOf reads CPU cpu's pending counts of the socket's total.
func (f *Filter) pendingOf(t testing.TB, cpu int) [sketch.NumClasses]sketch.Cell {
	t.Helper()
	var all []rakelimitPending
	if err := f.objs.Totals.Lookup(uint32(0), &all); err != nil {
		t.Fatalf("reading the pending totals: %v", err)
	}
	var out [sketch.NumClasses]sketch.Cell
	for c := range out {
		in := all[cpu].Cell[c]
		out[c].Epoch = in.Epoch
		for b := range in.Budget {
			out[c].Budget[b] = sketch.Counter{Offered: in.Budget[b].Offered, Forwarded: in.Budget[b].Forwarded}
		}
	}
	return out
}

// fairShares reads testCPU's fair shares.
func (f *Filter) fairShares(t testing.TB) [sketch.NumClasses][2]uint64 {
	t.Helper()
	cpu, err := testCPU()
	if err != nil {
		t.Fatal(err)
	}
	var all []rakelimitFair
	if err := f.objs.FairShares.Lookup(uint32(0), &all); err != nil {
		t.Fatalf("reading the fair shares: %v", err)
	}
	return all[cpu].Share
}

// lines reads the whole sketch map.
func (f *Filter) lines(t testing.TB) []sketch.Line {
	t.Helper()
	n := int(f.objs.Cells.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]sketch.Line, n)
	var cursor ebpf.MapBatchCursor
	got, err := f.objs.Cells.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("reading cells: %v", err)
	}
	if got != n {
		t.Fatalf("read %d cells, want %d", got, n)
	}
	out := make([]sketch.Line, n)
	for i, k := range keys {
		out[k] = vals[i]
	}
	return out
}

// packet describes a test frame.
type packet struct {
	src, dst     netip.Addr
	sport, dport uint16
	// data is the UDP payload; when nil, payload bytes of a fixed
	// pattern.
	data    []byte
	payload int
	// ipv4Options adds this many 4-byte words of IPv4 options.
	ipv4Options int
	// ipv4FragOffset sets the IPv4 fragment offset (in 8-byte units).
	ipv4FragOffset uint16
	// ipv6Ext lists IPv6 extension headers to insert before UDP.
	ipv6Ext []ipv6Ext
	// proto overrides the transport protocol (default UDP).
	proto uint8
	// etherType overrides the frame's ethertype.
	etherType uint16
	// truncate cuts the frame to this many bytes after the Ethernet header.
	truncate int
	// udpLen, when set, replaces the UDP header's length field, and
	// trailer adds this many bytes after the UDP datagram within the IP
	// datagram: a socket receives the UDP length's worth of payload.
	udpLen  int
	trailer int
}

type ipv6Ext struct {
	kind       uint8 // unix.IPPROTO_HOPOPTS, _ROUTING, _DSTOPTS, _FRAGMENT, _AH
	units      int   // length field value
	fragOffset uint16
}

const (
	ethHdrLen  = 14
	ipv4HdrLen = 20
	ipv6HdrLen = 40
	udpHdrLen  = 8
)

// frame builds the Ethernet frame of p.
func (p packet) frame() []byte {
	proto := p.proto
	if proto == 0 {
		proto = unix.IPPROTO_UDP
	}
	l4 := make([]byte, udpHdrLen, udpHdrLen+p.payload)
	l4 = append(l4, p.payloadBytes()...)
	binary.BigEndian.PutUint16(l4[0:], p.sport)
	binary.BigEndian.PutUint16(l4[2:], p.dport)
	binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	if p.udpLen > 0 {
		binary.BigEndian.PutUint16(l4[4:], uint16(p.udpLen))
	}
	l4 = append(l4, make([]byte, p.trailer)...)
	var ip []byte
	etherType := uint16(unix.ETH_P_IP)
	if p.src.Is4() {
		hl := ipv4HdrLen + 4*p.ipv4Options
		ip = make([]byte, hl)
		ip[0] = 0x40 | byte(hl/4)
		binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(l4)))
		binary.BigEndian.PutUint16(ip[6:], p.ipv4FragOffset)
		ip[8] = 64
		ip[9] = proto
		s, d := p.src.As4(), p.dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		for i := ipv4HdrLen; i < hl; i++ {
			ip[i] = 1 // NOP options
		}
	} else {
		etherType = unix.ETH_P_IPV6
		ip = make([]byte, ipv6HdrLen)
		ip[0] = 0x60
		s, d := p.src.As16(), p.dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		ip[7] = 64
		next := &ip[6]
		for _, e := range p.ipv6Ext {
			*next = e.kind
			var h []byte
			switch e.kind {
			case unix.IPPROTO_FRAGMENT:
				h = make([]byte, 8)
				binary.BigEndian.PutUint16(h[2:], e.fragOffset<<3)
			case unix.IPPROTO_AH:
				h = make([]byte, (e.units+2)*4)
			default:
				h = make([]byte, (e.units+1)*8)
			}
			h[1] = byte(e.units)
			if e.kind == unix.IPPROTO_FRAGMENT {
				h[1] = 0
			}
			ip = append(ip, h...)
			next = &ip[len(ip)-len(h)]
		}
		*next = proto
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-ipv6HdrLen+len(l4)))
	}
	if p.etherType != 0 {
		etherType = p.etherType
	}
	f := make([]byte, ethHdrLen, ethHdrLen+len(ip)+len(l4))
	copy(f[0:], []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(f[12:], etherType)
	f = append(f, ip...)
	f = append(f, l4...)
	if p.truncate > 0 {
		f = f[:ethHdrLen+p.truncate]
	}
	return f
}

// payloadBytes is p's UDP payload.
func (p packet) payloadBytes() []byte {
	if p.data != nil {
		return p.data
	}
	b := make([]byte, p.payload)
	for i := range b {
		b[i] = byte((i + udpHdrLen) * 31)
	}
	return b
}

// datagram is what the filter should read of p: the key (hasPorts says
// whether the UDP header is readable), the payload's length and the payload
// (the program reads its probe, and with VerifyIDs the length fields
// wherever they are).
func (p packet) datagram(hasPorts bool) decide.Datagram {
	d := decide.Datagram{Key: p.key(hasPorts)}
	if hasPorts {
		b := p.payloadBytes()
		if p.udpLen > 0 {
			b = b[:min(len(b), max(p.udpLen-udpHdrLen, 0))]
		}
		d.Length, d.Probe = len(b), b
	}
	return d
}

// key is what the filter should make of p.
func (p packet) key(hasPorts bool) sketch.Key {
	k := sketch.KeyFrom(netip.AddrPortFrom(p.src, p.sport), p.dport)
	if !hasPorts {
		k.HasPorts, k.SrcPort, k.DstPort = false, 0, 0
	}
	return k
}

var (
	dst4 = netip.MustParseAddr("192.0.2.254")
	dst6 = netip.MustParseAddr("2001:db8::fe")
)

func udp(src string, sport uint16) packet {
	a := netip.MustParseAddr(src)
	d := dst4
	if a.Is6() {
		d = dst6
	}
	return packet{src: a, dst: d, sport: sport, dport: 443, payload: 32}
}

// start is an arbitrary monotonic-clock reading.
const start = int64(5000 * time.Second)
