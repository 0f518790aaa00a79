//go:build linux

package kernel

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// coarseNow reads CLOCK_MONOTONIC_COARSE, the clock of
// bpf_ktime_get_coarse_ns.
func coarseNow(t *testing.T) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		t.Fatalf("reading the coarse clock: %v", err)
	}
	return uint64(ts.Nano())
}

// latestEpoch is the latest epoch of any cell: the epoch of the last
// datagram counted.
func (f *Program) latestEpoch(t *testing.T) uint32 {
	t.Helper()
	var latest uint32
	for _, l := range f.lines(t) {
		for _, c := range l.Cells {
			latest = max(latest, c.Epoch)
		}
	}
	return latest
}

// TestTickClock runs the production program (its clock not taken from the
// test) across a few dozen timer ticks: tick_clock reads the coarse clock
// once per tick and CPU, and every datagram's time, as the epoch of the
// cells it counts in, must lie between the coarse clock read just before
// the run, less the one tick that a reading taken as the tick moves jiffies
// may lag, and the coarse clock read just after.
func TestTickClock(t *testing.T) {
	tick := coarseTick()
	if tick == 0 {
		t.Fatal("the kernel gives no resolution for CLOCK_MONOTONIC_COARSE")
	}
	c := testutil.Limits(1_000_000)
	f := loadTest(t, c, loadOptions{})
	if !coarseClockFits(tick, uint64(c.Limiter.Window)) {
		t.Fatalf("a %v window with a %v tick does not read the coarse clock", c.Limiter.Window, time.Duration(tick))
	}
	frame := udp("198.51.100.7", 5000).Bytes()
	var moved int
	deadline := time.Now().Add(40 * time.Duration(tick))
	prev := uint32(0)
	for i := 0; i < 2000 && (i < 20 || time.Now().Before(deadline)); i++ {
		before := coarseNow(t)
		if _, err := runOnTestCPU(f.objs.Rakelimit, &ebpf.RunOptions{Data: frame}); err != nil {
			t.Fatalf("test run: %v", err)
		}
		after := coarseNow(t)
		got := f.latestEpoch(t)
		lo, hi := uint32((before-min(before, tick))>>sketch.EpochShift), uint32(after>>sketch.EpochShift)
		if got < lo || got > hi {
			t.Fatalf("datagram %d counted in epoch %d; the coarse clock read epochs %d before and %d after (tick %v)",
				i, got, before>>sketch.EpochShift, hi, time.Duration(tick))
		}
		if got != prev {
			moved++
			prev = got
		}
		time.Sleep(time.Duration(tick) / 3)
	}
	if moved < 10 {
		t.Fatalf("the datagrams' epoch moved %d times over 40 ticks", moved)
	}
}
