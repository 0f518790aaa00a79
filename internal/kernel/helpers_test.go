//go:build linux

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
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
func loadTest(t testing.TB, c decide.Config, o loadOptions) *Program {
	t.Helper()
	if o.hashKey == nil {
		hk := sketch.SeededHashKey(1)
		o.hashKey = &hk
	}
	f, err := load(c, o)
	testutil.RequireBPF(t, err)
	if err != nil {
		t.Fatalf("load: %+v%s", err, verifierTail(err))
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// verifierTailLines is how much of the verifier's log a failed load shows:
// enough to see where the path it refused came from.
const verifierTailLines = 60

// verifierTail is the end of the verifier's log in err, when err is a
// LoadError that carries one, for a test to show what LoadError's one line
// leaves out (where a kernel refuses the program, e.g. in .ci/kernels.sh).
func verifierTail(err error) string {
	var le *LoadError
	if !errors.As(err, &le) || len(le.VerifierLog) == 0 {
		return ""
	}
	log := le.VerifierLog[max(0, len(le.VerifierLog)-verifierTailLines):]
	return fmt.Sprintf("\nthe verifier's log, last %d of %d lines:\n%s", len(log), len(le.VerifierLog), strings.Join(log, "\n"))
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
func (f *Program) run(t testing.TB, frame []byte, now int64, rnd uint32) rakelimitVerdict {
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

// xdpMD is struct xdp_md as BPF_PROG_TEST_RUN takes it: data is the
// length of the metadata before the frame, data_end the length of both.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// xdpTestMeta is struct xdp_test_meta, the metadata a test-mode XDP
// program reads its time and random number from.
type xdpTestMeta struct {
	NowLo, NowHi, Random uint32
}

// xdpRun runs a test-mode filter's XDP program once on frame at time now
// with random number rnd, and returns what the program returned.
func (f *Program) xdpRun(frame []byte, now int64, rnd uint32) (uint32, error) {
	meta := xdpTestMeta{NowLo: uint32(now), NowHi: uint32(uint64(now) >> 32), Random: rnd}
	data := binary.NativeEndian.AppendUint32(nil, meta.NowLo)
	data = binary.NativeEndian.AppendUint32(data, meta.NowHi)
	data = binary.NativeEndian.AppendUint32(data, meta.Random)
	n := uint32(len(data))
	data = append(data, frame...)
	return runOnTestCPU(f.objs.RakelimitXdp, &ebpf.RunOptions{Data: data,
		Context: xdpMD{Data: n, DataEnd: uint32(len(data))}})
}

// unwritten is the verdict a test writes to test_verdict before a run, to
// tell whether the program decided: the program writes every field.
var unwritten = rakelimitVerdict{Pad: [7]uint8{0xee}}

// resetVerdict writes unwritten to test_verdict; verdict reads it back, and
// whether the program wrote it.
func (f *Program) resetVerdict(t testing.TB) {
	t.Helper()
	if err := f.objs.TestVerdict.Put(uint32(0), unwritten); err != nil {
		t.Fatalf("resetting the verdict: %v", err)
	}
}

func (f *Program) verdict(t testing.TB) (rakelimitVerdict, bool) {
	t.Helper()
	var v rakelimitVerdict
	if err := f.objs.TestVerdict.Lookup(uint32(0), &v); err != nil {
		t.Fatalf("reading verdict: %v", err)
	}
	return v, v != unwritten
}

// The XDP program's verdicts.
const (
	xdpDrop = 1 // XDP_DROP
	xdpPass = 2 // XDP_PASS
)

// loopbackIndex is the interface BPF_PROG_TEST_RUN puts a socket filter's
// packets on (skb->dev): the loopback device, interface 1.
const loopbackIndex = 1

// listenEverywhere makes a test-mode filter's XDP program decide every
// UDP datagram to the tests' destinations (dst4, dst6) on every port, and
// counts an interface the XDP program runs on for the socket filter, so
// that runPath is the path of a datagram in mode xdp. A datagram to any
// other address (a fuzzed one) is the path's too: the XDP program passes
// it undecided, and the socket filter decides it.
func listenEverywhere(t testing.TB, f *Program) {
	t.Helper()
	var table rakelimitListenTable
	var keys []rakelimitListenKey
	for port := range 1 << 16 {
		table.Kinds[port] = listenSome4 | listenSome6
		keys = append(keys, listenKey(dst4, uint16(port)), listenKey(dst6, uint16(port)))
	}
	if _, err := f.objs.ListenAddrs.BatchUpdate(keys, make([]uint8, len(keys)), nil); err != nil {
		t.Fatalf("listing the listeners: %v", err)
	}
	if err := f.objs.ListenPorts.Put(uint32(0), &table); err != nil {
		t.Fatal(err)
	}
	if err := f.markXDP(loopbackIndex, true); err != nil {
		t.Fatal(err)
	}
}

// pathVerdict is what runPath found: the verdict of the program that
// decided the datagram, which by.
type pathVerdict struct {
	v  rakelimitVerdict
	by string
}

// runPath feeds one frame through the path of mode xdp: the XDP program,
// and, unless it dropped the frame, the socket filter on an interface the
// XDP program runs on (listenEverywhere). It fails the test unless exactly
// one of them decided the datagram, each returned what it recorded, and the
// socket filter passed what the XDP program decided.
func (f *Program) runPath(t testing.TB, frame []byte, now int64, rnd uint32) pathVerdict {
	t.Helper()
	f.resetVerdict(t)
	ret, err := f.xdpRun(frame, now, rnd)
	if err != nil {
		t.Fatalf("XDP test run: %v", err)
	}
	v, atXDP := f.verdict(t)
	if atXDP && (ret == xdpDrop) != (v.Drop == 1 && !f.Config().DryRun) {
		t.Fatalf("the XDP program returned %d but recorded drop=%d", ret, v.Drop)
	}
	if !atXDP && ret != xdpPass {
		t.Fatalf("the XDP program returned %d without deciding", ret)
	}
	if ret == xdpDrop {
		return pathVerdict{v, "the XDP program"}
	}
	f.resetVerdict(t)
	sret, err := runOnTestCPU(f.objs.Rakelimit, &ebpf.RunOptions{Data: frame,
		Context: skbContext{CB: [5]uint32{uint32(now), uint32(uint64(now) >> 32), rnd}}})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	sv, atSocket := f.verdict(t)
	switch {
	case atXDP && atSocket:
		t.Fatalf("decided twice: by the XDP program (%+v) and the socket filter (%+v)", v, sv)
	case atXDP && sret == 0:
		t.Fatal("the socket filter dropped a datagram the XDP program passed, without deciding it")
	case atXDP:
		return pathVerdict{v, "the XDP program"}
	case !atSocket:
		t.Fatal("neither the XDP program nor the socket filter decided")
	case (sret == 0) != (sv.Drop == 1 && !f.Config().DryRun):
		t.Fatalf("the socket filter returned %d but recorded drop=%d", sret, sv.Drop)
	}
	return pathVerdict{sv, "the socket filter"}
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
func (f *Program) pending(t testing.TB) [sketch.NumClasses]sketch.Cell {
	t.Helper()
	cpu, err := testCPU()
	if err != nil {
		t.Fatal(err)
	}
	return f.pendingOf(t, cpu)
}

// pendingOf reads CPU cpu's pending counts of the socket's total.
func (f *Program) pendingOf(t testing.TB, cpu int) [sketch.NumClasses]sketch.Cell {
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
func (f *Program) fairShares(t testing.TB) [sketch.NumClasses][2]uint64 {
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
func (f *Program) lines(t testing.TB) []sketch.Line {
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

var (
	dst4 = netip.MustParseAddr("192.0.2.254")
	dst6 = netip.MustParseAddr("2001:db8::fe")
)

// udp is a frame of a 32-byte datagram from src:sport to port 443 of a
// documentation address of src's family.
func udp(src string, sport uint16) testutil.Frame {
	a := netip.MustParseAddr(src)
	d := dst4
	if a.Is6() {
		d = dst6
	}
	return testutil.Frame{Src: a, Dst: d, SrcPort: sport, DstPort: 443, Payload: 32}
}

// start is an arbitrary monotonic-clock reading.
const start = int64(5000 * time.Second)

// proveForTest makes addr an answered peer of f, and a proven one, as the
// program makes one that sends back a server ID bound to it.
func proveForTest(tb testing.TB, f *Program, addr netip.Addr) {
	tb.Helper()
	if err := f.ProveForBench(addr); err != nil {
		tb.Fatal(err)
	}
}
