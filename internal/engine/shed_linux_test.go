//go:build linux

package engine

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestShedKeepsShortHeaders: in userspace mode, on a real socket read by a
// slow reader (a quic-go that falls behind), a flood of Initials ten times
// what the reader takes makes the pre-filter shed long headers in the
// kernel, with a WARN line, so that the receive queue stops overflowing and
// the short headers sent meanwhile (an established connection's, its close
// among them) reach the reader, where tail drop would have delivered about
// one in ten; once the flood is over the shed stops. The limiter's own
// limits are out of reach: only the queue decides.
func TestShedKeepsShortHeaders(t *testing.T) {
	c := decide.Config{Classify: true, Limiter: sketch.Config{Limit: 1_000_000, Window: time.Second,
		Established: sketch.Limits{Limit: 1_000_000}}}
	core, logs := observer.New(zapcore.InfoLevel)
	l, err := New("shed", c, ModeUserspace, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rx := smallQueue(t)
	out, attached, err := l.Attach(rx)
	if err != nil || !attached {
		t.Fatalf("attaching: %v (attached %v)", err, attached)
	}
	pf := l.Engine().(Prefiltered)
	// The reader takes 2,000 datagrams a second at most.
	var long, short atomic.Int64
	stopReader := slowReader(out, 500*time.Microsecond, func(b []byte) {
		if b[0]&0x80 != 0 {
			long.Add(1)
		} else {
			short.Add(1)
		}
	})
	dst := netip.MustParseAddrPort(rx.LocalAddr().String())
	initial := quicclasstest.LongHeader(quicclass.Version1, 0, 8, 8, 1200)
	established := quicclasstest.ShortHeader(100)
	// 3 s of Initials at 20,000 a second from 16 ports, and of short
	// headers at 200 a second from another address; bounded in count.
	const senders, rate, shortRate, seconds = 16, 20_000, 200, 3
	done := make(chan error, senders+1)
	for range senders {
		s := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
		go func() {
			done <- testutil.Pace(s, dst, rate/senders, seconds*rate/senders, func() []byte { return initial })
		}()
	}
	peer := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.2:0"))
	go func() {
		done <- testutil.Pace(peer, dst, shortRate, seconds*shortRate, func() []byte { return established })
	}()
	var peak float64
	waitSent(t, done, senders+1, 10*time.Second, func() { peak = max(peak, pf.Prefilter().Shed) })
	testutil.WaitRead(t, int(testutil.PortOf(rx)))
	st := pf.Prefilter()
	got := short.Load()
	t.Logf("shed at most %.3f of long headers; the reader got %d of %d short headers and %d of %d Initials; %d shed (estimated)",
		peak, got, seconds*shortRate, long.Load(), seconds*rate, st.ShedDropped)
	if peak < 0.5 {
		t.Errorf("the pre-filter shed at most %.3f of long headers under a flood ten times what the reader takes, want > 0.5", peak)
	}
	if st.ShedDropped == 0 {
		t.Error("no shed drop estimated")
	}
	if want := int64(0.8 * seconds * shortRate); got < want {
		t.Errorf("the reader got %d short headers of %d, want at least %d", got, seconds*shortRate, want)
	}
	if n := logs.FilterMessageSnippet("sheds connection-opening packets").FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d WARN lines about the shed, want 1", n)
	}
	for end := time.Now().Add(5 * time.Second); pf.Prefilter().Shed > 0; time.Sleep(backlog.Period) {
		if time.Now().After(end) {
			t.Fatalf("5 s after the flood the pre-filter still sheds %.3f of long headers", pf.Prefilter().Shed)
		}
	}
	stopReader()
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "shed") {
			t.Logf("%s: %s %v", e.Level, e.Message, e.ContextMap())
		}
	}
}
