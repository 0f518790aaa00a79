package engine

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/egress"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// fakeEngine is an engine whose attaching can fail and whose events a test
// sends.
type fakeEngine struct {
	mode       string
	protectErr error
	params     *sketch.Params
	events     *fakeEvents

	mu        sync.Mutex
	config    datagram.Config
	protected []*net.UDPConn
	closed    bool
}

func newFake(t *testing.T, mode string, protectErr error) *fakeEngine {
	t.Helper()
	p, err := sketch.Compile(testConfig(100).Limiter)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEngine{mode: mode, protectErr: protectErr, params: p, events: newFakeEvents()}
}

func (e *fakeEngine) Mode() string { return e.mode }
func (e *fakeEngine) Configure(c datagram.Config) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.Limiter.Limit == 0 {
		return errors.New("limit 0")
	}
	e.config = c
	return nil
}
func (e *fakeEngine) Params() *sketch.Params                                 { return e.params }
func (e *fakeEngine) Stats() (datagram.Stats, error)                         { return datagram.Stats{}, nil }
func (e *fakeEngine) Streams() ([]datagram.Stream, error)                    { return nil, nil }
func (e *fakeEngine) Untracked() (uint64, error)                             { return 0, nil }
func (e *fakeEngine) ExpireStreams(time.Duration) ([]datagram.Stream, error) { return nil, nil }
func (e *fakeEngine) Sweep() (int, error)                                    { return 0, nil }
func (e *fakeEngine) Events() (EventReader, error)                           { return e.events, nil }
func (e *fakeEngine) Protect(conn *net.UDPConn, _ *egress.Learner) (net.PacketConn, error) {
	if e.protectErr != nil {
		return nil, e.protectErr
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.protected = append(e.protected, conn)
	return conn, nil
}
func (e *fakeEngine) Unprotect(conn *net.UDPConn) (bool, error)     { return !IsClosed(conn), nil }
func (e *fakeEngine) LearnServerID(datagram.ServerID) error         { return nil }
func (e *fakeEngine) LearnPeer(netip.Addr) error                    { return nil }
func (e *fakeEngine) ExpireLearned(time.Duration) (int, int, error) { return 0, 0, nil }
func (e *fakeEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}
func (e *fakeEngine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// fakeEvents is an event reader fed by a test.
type fakeEvents struct {
	ch   chan datagram.Stream
	once sync.Once
	done chan struct{}
}

func newFakeEvents() *fakeEvents {
	return &fakeEvents{ch: make(chan datagram.Stream, 1), done: make(chan struct{})}
}

func (f *fakeEvents) Read() (datagram.Stream, error) {
	select {
	case st := <-f.ch:
		return st, nil
	case <-f.done:
		return datagram.Stream{}, os.ErrClosed
	}
}

func (f *fakeEvents) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

func testConfig(limit uint32) datagram.Config {
	return datagram.Config{Limiter: sketch.Config{Limit: limit, Window: time.Second}, Classify: true}
}

func listen(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startFake runs a limiter on a fake BPF engine whose attaching fails with
// attachErr, falling back to the fake userspace engine returned.
func startFake(t *testing.T, mode string, attachErr error) (*Limiter, *fakeEngine, *fakeEngine, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	k, u := newFake(t, ModeBPF, attachErr), newFake(t, ModeUserspace, nil)
	l, err := start("test", mode, k, Setting{Config: testConfig(100), Logger: zap.New(core)},
		func(datagram.Config) (Engine, error) { return u, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, k, u, logs
}

// TestFallBack: in mode auto, a BPF filter that cannot attach to the first
// socket gives way to the userspace limiter, with one warning; in mode bpf,
// and once a socket is protected, the error stands.
func TestFallBack(t *testing.T) {
	denied := errors.New("attaching: operation not permitted")
	for _, tt := range []struct {
		name      string
		mode      string
		attachErr error
		// protectedFirst attaches a socket before the failing one, on
		// an engine that attaches.
		wantErr  bool
		wantMode string
	}{
		{name: "auto falls back", mode: ModeAuto, attachErr: denied, wantMode: ModeUserspace},
		{name: "bpf refuses", mode: ModeBPF, attachErr: denied, wantErr: true, wantMode: ModeBPF},
		{name: "auto attaches", mode: ModeAuto, wantMode: ModeBPF},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, k, u, logs := startFake(t, tt.mode, tt.attachErr)
			conn := listen(t)
			out, attached, err := l.Attach(conn)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Attach: %v, want error %v", err, tt.wantErr)
			}
			if l.Mode() != tt.wantMode {
				t.Fatalf("mode %s, want %s", l.Mode(), tt.wantMode)
			}
			warned := logs.FilterMessageSnippet("cannot attach").Len()
			if tt.wantMode == ModeUserspace {
				if !attached || out != net.PacketConn(conn) || len(u.protected) != 1 || !k.isClosed() {
					t.Fatalf("after the fallback: attached %v, userspace protects %d sockets, BPF closed %v",
						attached, len(u.protected), k.isClosed())
				}
				if warned != 1 {
					t.Fatalf("%d warnings of the fallback, want 1", warned)
				}
				return
			}
			if warned != 0 || k.isClosed() {
				t.Fatalf("no fallback wanted: %d warnings, BPF closed %v", warned, k.isClosed())
			}
		})
	}
}

// TestNoFallBackOnceProtecting: the BPF filter, protecting a socket, does
// not give way when a later socket cannot take it.
func TestNoFallBackOnceProtecting(t *testing.T) {
	l, k, _, _ := startFake(t, ModeAuto, nil)
	if _, _, err := l.Attach(listen(t)); err != nil {
		t.Fatal(err)
	}
	k.protectErr = errors.New("denied")
	if _, _, err := l.Attach(listen(t)); err == nil || l.Mode() != ModeBPF {
		t.Fatalf("second socket: error %v, mode %s; want the error, in bpf mode", err, l.Mode())
	}
	if got := len(l.Sockets()); got != 1 {
		t.Fatalf("%d sockets protected, want 1", got)
	}
}

// TestEventsAfterFallBack: the events of the engine in force are logged,
// before and after a fallback replaced the engine.
func TestEventsAfterFallBack(t *testing.T) {
	l, k, u, logs := startFake(t, ModeAuto, errors.New("denied"))
	stream := func(src string) datagram.Stream {
		return datagram.Stream{Class: quicclass.Invalid, Reason: quicclass.SourcePort,
			Key: sketch.KeyFrom(netip.MustParseAddrPort(src), 443), First: time.Now(), Last: time.Now()}
	}
	waitLog := func(src string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, e := range logs.FilterMessage("dropping invalid datagrams").All() {
				if e.ContextMap()["stream"] == src+" -> :443" {
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no log line for the stream of %s; logs: %v", src, logs.All())
	}
	k.events.ch <- stream("192.0.2.1:53")
	waitLog("192.0.2.1")
	if _, _, err := l.Attach(listen(t)); err != nil || l.Mode() != ModeUserspace {
		t.Fatalf("Attach: %v, mode %s", err, l.Mode())
	}
	u.events.ch <- stream("192.0.2.2:53")
	waitLog("192.0.2.2")
}

// TestPutRestore: Put applies a setting and returns the one it replaced;
// Restore puts it back only while the setting it undoes is in force; a
// setting the engine refuses changes nothing.
func TestPutRestore(t *testing.T) {
	l, k, _, logs := startFake(t, ModeAuto, nil)
	first, second := "first", "second"
	prev, err := l.Put(Setting{Config: testConfig(200), Logger: l.Setting().Logger, By: first})
	if err != nil || prev.Config.Limiter.Limit != 100 {
		t.Fatalf("Put: %v, previous limit %d", err, prev.Config.Limiter.Limit)
	}
	if _, err := l.Put(Setting{Config: testConfig(300), Logger: l.Setting().Logger, By: second}); err != nil {
		t.Fatal(err)
	}
	l.Restore(prev, first) // the second has taken over: nothing changes
	if got := l.Setting().Config.Limiter.Limit; got != 300 || k.config.Limiter.Limit != 300 {
		t.Fatalf("after restoring an overtaken setting: limit %d (engine %d), want 300", got, k.config.Limiter.Limit)
	}
	l.Restore(Setting{Config: testConfig(200), Logger: l.Setting().Logger, By: first}, second)
	if got := l.Setting().Config.Limiter.Limit; got != 200 || k.config.Limiter.Limit != 200 {
		t.Fatalf("after restoring: limit %d (engine %d), want 200", got, k.config.Limiter.Limit)
	}
	if _, err := l.Put(Setting{Config: testConfig(0), Logger: l.Setting().Logger}); err == nil || l.Setting().Config.Limiter.Limit != 200 {
		t.Fatalf("a refused setting: %v, limit %d", err, l.Setting().Config.Limiter.Limit)
	}
	if n := logs.FilterMessage("new settings in force").Len(); n != 2 {
		t.Fatalf("%d lines of new settings, want 2 (one per Put that changed them)", n)
	}
}

// TestCloseLeavesOpenSockets: closing the limiter says which open listener
// is no longer protected, and forgets closed ones.
func TestCloseLeavesOpenSockets(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	k := newFake(t, ModeBPF, nil)
	l, err := start("test", ModeBPF, k, Setting{Config: testConfig(100), Logger: zap.New(core)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	open, closed := listen(t), listen(t)
	for _, c := range []*net.UDPConn{open, closed} {
		if _, _, err := l.Attach(c); err != nil {
			t.Fatal(err)
		}
	}
	closed.Close()
	if _, addrs := l.Snapshot(); len(addrs) != 1 || addrs[0] != open.LocalAddr().String() {
		t.Fatalf("listeners %v, want only %s", addrs, open.LocalAddr())
	}
	if err := l.Close(); err != nil || !k.isClosed() {
		t.Fatalf("Close: %v, engine closed %v", err, k.isClosed())
	}
	if n := logs.FilterMessage("rakelimit removed from the configuration: listener no longer protected").Len(); n != 1 {
		t.Fatalf("%d warnings of unprotected listeners, want 1", n)
	}
}
