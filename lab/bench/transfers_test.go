//go:build linux

package bench

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestTransfers runs the four transfer cases against an in-process HTTP/3
// server: every byte arrives, and each case is measured.
func TestTransfers(t *testing.T) {
	sz := sizesFor(0.01) // 2 MB, 1 MB, 20 x 100 kB
	s := startTestServer(t, sz)
	res, err := transfers(context.Background(), s.dst, sz, s.backend, "t1", 20*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name           string
		conns, streams int
		bytes          int64
	}{
		{transferDownload, 1, 1, 2e6}, {transferUpload, 1, 1, 1e6}, {transferOneConn, 1, 20, 2e6}, {transferManyConn, 20, 20, 2e6},
	}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d", len(res), len(want))
	}
	for i, w := range want {
		r := res[i]
		if r.Name != w.name || r.Connections != w.conns || r.Streams != w.streams || r.Expected != w.bytes || r.Got != w.bytes ||
			r.TimedOut || r.Error != "" || r.Mbps <= 0 || r.Seconds <= 0 {
			t.Errorf("%s: %+v", w.name, r)
		}
	}
	if got := s.backend.counter("t1").Load(); got != 1e6 {
		t.Errorf("backend read %d bytes of the upload", got)
	}
}

// TestTransferStall: a download that stops making progress is cut after the
// stall time and reported as a timeout with the bytes it got.
func TestTransferStall(t *testing.T) {
	s := startTestServer(t, sizesFor(0.001))
	var got atomic.Int64
	run := newTransferRun(context.Background(), 10*time.Second, 300*time.Millisecond, got.Load)
	start := time.Now()
	err := download(run.ctx, transferSrc, s.dst, "/files/stall", func(n int) { got.Add(int64(n)) })
	res := run.result(TransferResult{Name: "stall", Expected: 1e6}, err)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("stalled transfer returned after %v", d)
	}
	if !res.TimedOut || res.Got != 5000 || !strings.Contains(res.Error, "no progress for 300ms") {
		t.Fatalf("result %+v: want a timeout with 5000 bytes", res)
	}
	// The overall limit applies too, progress or not.
	run = newTransferRun(context.Background(), 200*time.Millisecond, time.Hour, func() int64 { return time.Now().UnixNano() })
	<-run.ctx.Done()
	if res := run.result(TransferResult{Expected: 1}, run.ctx.Err()); !res.TimedOut || !strings.Contains(res.Error, "not done after 200ms") {
		t.Fatalf("overall timeout: %+v", res)
	}
}

func TestTransferIncomplete(t *testing.T) {
	run := newTransferRun(context.Background(), time.Second, time.Second, func() int64 { return 10 })
	res := run.result(TransferResult{Expected: 20}, nil)
	if res.TimedOut || res.Error != "got 10 bytes, want 20" {
		t.Fatalf("short transfer: %+v", res)
	}
}

func TestPatternReader(t *testing.T) {
	b, err := io.ReadAll(io.LimitReader(newPatternReader(), 200_000))
	if err != nil || len(b) != 200_000 {
		t.Fatalf("read %d, %v", len(b), err)
	}
	if string(b[:64<<10]) != string(b[64<<10:128<<10]) || string(b[:100]) == string(b[100:200]) {
		t.Error("not a repeated random block")
	}
}

func TestSizesFor(t *testing.T) {
	if sz := sizesFor(1); sz.Download != 200e6 || sz.Upload != 100e6 || sz.Each != 10e6 {
		t.Errorf("full sizes %+v", sz)
	}
	if sz := sizesFor(0.00001); sz.Each != 64<<10 {
		t.Errorf("tiny sizes %+v: want the 64 KiB floor", sz)
	}
}
