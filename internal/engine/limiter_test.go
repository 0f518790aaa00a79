package engine

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
)

// fakeEngine is an engine whose attaching can fail and whose events a test
// sends.
type fakeEngine struct {
	mode       string
	protectErr error
	params     *sketch.Params
	events     *fakeEvents

	mu        sync.Mutex
	config    decide.Config
	protected []*net.UDPConn
	closed    bool
	// learned are the engine's learned sets; adopted the sets it took
	// over from the engine before it.
	learned decide.Learned
	adopted *decide.Learned
	// hk is the engine's hash key, opened with the hash key it was
	// given (nil: none).
	hk       sketch.HashKey
	openedOn *sketch.HashKey
	// filters, shared by the fakes of a test, is each socket's one kernel
	// filter, as the kernel keeps it: Protect puts the engine's there (a
	// BPF program, or the userspace mode's classic pre-filter), Unprotect
	// detaches whatever is there, whoever put it.
	filters *socketFilters
}

// socketFilters is the kernel filter of each socket, as the fakes attach
// and detach them.
type socketFilters struct {
	mu sync.Mutex
	of map[*net.UDPConn]*fakeEngine
}

// filterOf returns the engine whose filter conn has, or nil.
func (f *socketFilters) filterOf(conn *net.UDPConn) *fakeEngine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.of[conn]
}

func newFake(t *testing.T, mode string, protectErr error) *fakeEngine {
	t.Helper()
	p, err := sketch.Compile(testConfig(100).Limiter)
	if err != nil {
		t.Fatal(err)
	}
	hk, err := sketch.NewHashKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEngine{mode: mode, protectErr: protectErr, params: p, events: newFakeEvents(), learned: decide.NewLearned(), hk: hk}
}

func (e *fakeEngine) Mode() string { return e.mode }
func (e *fakeEngine) Configure(c decide.Config) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.Limiter.Limit == 0 {
		return errors.New("limit 0")
	}
	e.config = c
	return nil
}
func (e *fakeEngine) Params() *sketch.Params { return e.params }
func (e *fakeEngine) configured() decide.Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.config
}
func (e *fakeEngine) Stats() (decide.Stats, error)                         { return decide.Stats{}, nil }
func (e *fakeEngine) Streams() ([]decide.Stream, error)                    { return nil, nil }
func (e *fakeEngine) Untracked() (uint64, error)                           { return 0, nil }
func (e *fakeEngine) ExpireStreams(time.Duration) ([]decide.Stream, error) { return nil, nil }
func (e *fakeEngine) Sweep() (int, error)                                  { return 0, nil }
func (e *fakeEngine) Events() (EventReader, error)                         { return e.events, nil }
func (e *fakeEngine) Protect(conn *net.UDPConn, read ReadConn) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.protectErr != nil {
		return e.protectErr
	}
	if read == nil || read.Unwrap() != conn {
		return errors.New("the read conn is not the socket's")
	}
	e.protected = append(e.protected, conn)
	if e.filters != nil {
		e.filters.mu.Lock()
		e.filters.of[conn] = e
		e.filters.mu.Unlock()
	}
	return nil
}
func (e *fakeEngine) Unprotect(conn *net.UDPConn) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.protected = slices.DeleteFunc(e.protected, func(c *net.UDPConn) bool { return c == conn })
	if e.filters != nil {
		e.filters.mu.Lock()
		delete(e.filters.of, conn)
		e.filters.mu.Unlock()
	}
	return !IsClosed(conn), nil
}
func (e *fakeEngine) setProtectErr(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.protectErr = err
}
func (e *fakeEngine) protecting() []*net.UDPConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.protected)
}
func (e *fakeEngine) LearnServerID(decide.ServerID, netip.Addr) error { return nil }
func (e *fakeEngine) LearnPeer(netip.Addr) error                      { return nil }
func (e *fakeEngine) Grant(netip.Addr, int) error                     { return nil }
func (e *fakeEngine) ExpireLearned(time.Duration) ([decide.NumLearned]int, error) {
	return [decide.NumLearned]int{}, nil
}
func (e *fakeEngine) Learned() decide.Learned { return e.learned }
func (e *fakeEngine) HashKey() sketch.HashKey { return e.hk }
func (e *fakeEngine) AdoptLearned(from decide.Learned) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.adopted = &from
}
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
	ch   chan decide.Stream
	once sync.Once
	done chan struct{}
}

func newFakeEvents() *fakeEvents {
	return &fakeEvents{ch: make(chan decide.Stream, 1), done: make(chan struct{})}
}

func (f *fakeEvents) Read() (decide.Stream, error) {
	select {
	case st := <-f.ch:
		return st, nil
	case <-f.done:
		return decide.Stream{}, os.ErrClosed
	}
}

func (f *fakeEvents) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

func testConfig(limit uint32) decide.Config {
	return decide.Config{Limiter: sketch.Config{Limit: limit, Window: time.Second}, Classify: true}
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
	l, err := start("test", k, Setting{Config: testConfig(100), Mode: mode, Logger: zap.New(core)},
		func(_ Mode, c decide.Config, hk *sketch.HashKey) (Engine, error) {
			u.openedOn = hk
			return u, u.Configure(c)
		})
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
				if read, ok := out.(*packetconn.Conn); !attached || !ok || read.UDPConn != conn || len(u.protecting()) != 1 || !k.isClosed() {
					t.Fatalf("after the fallback: attached %v, userspace protects %d sockets, BPF closed %v",
						attached, len(u.protecting()), k.isClosed())
				}
				if warned != 1 {
					t.Fatalf("%d warnings of the fallback, want 1", warned)
				}
				// The new engine hashes with the old one's key, and takes
				// over what it learned (TestFallBackKeepsLearned, with two
				// real engines).
				if u.openedOn == nil || *u.openedOn != k.hk || u.adopted == nil || u.adopted.IDs != k.learned.IDs {
					t.Fatalf("the userspace engine was opened on the BPF engine's key: %v; adopted its sets: %v",
						u.openedOn != nil && *u.openedOn == k.hk, u.adopted != nil)
				}
				return
			}
			if warned != 0 || k.isClosed() {
				t.Fatalf("no fallback wanted: %d warnings, BPF closed %v", warned, k.isClosed())
			}
		})
	}
}

// TestFallBackKeepsThePrefilter: a socket has one kernel filter. When a
// BPF filter that protects a socket cannot attach to a later one, the
// limiter moves to userspace, whose engine attaches its classic pre-filter
// to every socket: the BPF filter leaves the earlier socket before that, so
// that taking it away does not take the pre-filter with it.
func TestFallBackKeepsThePrefilter(t *testing.T) {
	filters := &socketFilters{of: map[*net.UDPConn]*fakeEngine{}}
	k, u := newFake(t, ModeBPF, nil), newFake(t, ModeUserspace, nil)
	k.filters, u.filters = filters, filters
	l, err := start("test", k, Setting{Config: testConfig(100), Mode: ModeAuto, Logger: zap.NewNop()},
		func(_ Mode, c decide.Config, _ *sketch.HashKey) (Engine, error) { return u, u.Configure(c) })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first, second := listen(t), listen(t)
	if _, _, err := l.Attach(first); err != nil || filters.filterOf(first) != k {
		t.Fatalf("the BPF filter did not protect the first socket: %v", err)
	}
	k.setProtectErr(errors.New("attaching: operation not permitted"))
	if _, _, err := l.Attach(second); err != nil || l.Mode() != ModeUserspace {
		t.Fatalf("the second socket did not move the limiter to userspace: %v, mode %s", err, l.Mode())
	}
	for i, c := range []*net.UDPConn{first, second} {
		if got := filters.filterOf(c); got != u {
			t.Errorf("socket %d has the filter of %v, want the userspace engine's pre-filter", i, got)
		}
	}
}

// TestLaterSocketFallsBack: in mode auto, a BPF filter that protects a
// socket and cannot attach to a later one moves the whole limiter to
// userspace: every socket, the earlier one too, reads through the userspace
// limiter, and the filter leaves the earlier socket; in mode bpf the later
// socket is served unprotected, through a conn that passes everything, and
// the filter attaches to it at the next Put, once it can; a Put that asks
// for mode auto gives a limiter started in mode bpf the fallback.
func TestLaterSocketFallsBack(t *testing.T) {
	denied := errors.New("attaching: operation not permitted")
	for _, tt := range []struct {
		name string
		mode string
		// putMode is the mode a Put asks for after the failure;
		// healed lets the filter attach again before it.
		putMode string
		healed  bool
		// wantMode is the engine in force at the end, and
		// wantUnprotected the sockets still unprotected.
		wantMode        string
		wantUnprotected int
	}{
		{name: "auto moves every socket", mode: ModeAuto, putMode: ModeAuto, wantMode: ModeUserspace},
		{name: "bpf serves the socket unprotected", mode: ModeBPF, putMode: ModeBPF, wantMode: ModeBPF, wantUnprotected: 1},
		{name: "bpf attaches at the next Put", mode: ModeBPF, putMode: ModeBPF, healed: true, wantMode: ModeBPF},
		{name: "a Put to auto falls back", mode: ModeBPF, putMode: ModeAuto, wantMode: ModeUserspace},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, k, u, _ := startFake(t, tt.mode, nil)
			first, later := listen(t), listen(t)
			if _, attached, err := l.Attach(first); err != nil || !attached {
				t.Fatalf("first socket: attached %v, %v", attached, err)
			}
			k.setProtectErr(denied)
			out, attached, err := l.Attach(later)
			read, ok := out.(*packetconn.Conn)
			if !ok || read.UDPConn != later || read.Learner() == nil {
				t.Fatalf("later socket: conn %T, want a conn on the socket that teaches the learner", out)
			}
			if tt.mode == ModeAuto {
				if err != nil || !attached {
					t.Fatalf("later socket in mode auto: attached %v, %v", attached, err)
				}
			} else if !errors.Is(err, denied) || attached || len(l.Unprotected()) != 1 {
				t.Fatalf("later socket in mode bpf: attached %v, %v, %d unprotected; want the error",
					attached, err, len(l.Unprotected()))
			}
			if tt.healed {
				k.setProtectErr(nil)
			}
			if _, err := l.Put(Setting{Config: testConfig(200), Mode: tt.putMode, Logger: l.Setting().Logger}); err != nil {
				t.Fatal(err)
			}
			if l.Mode() != tt.wantMode || len(l.Unprotected()) != tt.wantUnprotected || l.Requested() != tt.putMode {
				t.Fatalf("mode %s, %d unprotected, asked for %s; want %s, %d, %s",
					l.Mode(), len(l.Unprotected()), l.Requested(), tt.wantMode, tt.wantUnprotected, tt.putMode)
			}
			want := 2 - tt.wantUnprotected
			if got := len(l.Sockets()); got != want {
				t.Fatalf("%d sockets protected, want %d", got, want)
			}
			if tt.wantMode == ModeUserspace {
				if len(u.protecting()) != 2 || len(k.protecting()) != 0 || !k.isClosed() {
					t.Fatalf("after the move: userspace protects %d sockets, the filter %d, closed %v; want 2, 0, true",
						len(u.protecting()), len(k.protecting()), k.isClosed())
				}
				if got := u.config.Limiter.Limit; got != 200 {
					t.Fatalf("userspace limit %d, want the setting in force", got)
				}
				return
			}
			if len(k.protecting()) != want {
				t.Fatalf("the filter protects %d sockets, want %d", len(k.protecting()), want)
			}
		})
	}
}

// TestEventsAfterFallBack: the events of the engine in force are logged,
// before and after a fallback replaced the engine.
func TestEventsAfterFallBack(t *testing.T) {
	l, k, u, logs := startFake(t, ModeAuto, errors.New("denied"))
	stream := func(src string) decide.Stream {
		return decide.Stream{Class: quicclass.Invalid, Reason: quicclass.SourcePort,
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
	l, err := start("test", k, Setting{Config: testConfig(100), Mode: ModeBPF, Logger: zap.New(core)}, nil)
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

// TestOverflowCount: each period counts the smaller of the namespace's
// receive-buffer errors and the sockets' drops; counters that go back count
// nothing.
func TestOverflowCount(t *testing.T) {
	var o overflowCount
	for _, tt := range []struct {
		name      string
		ns, socks uint64
		want      uint64
	}{
		{"first reading", 1000, 50, 0},
		{"other sockets overflow", 1100, 60, 10},
		{"the pre-filter drops", 1105, 200, 15},
		{"both", 1205, 300, 115},
		{"a socket closed", 1300, 10, 115},
		{"after", 1310, 30, 125},
	} {
		if got := o.add(tt.ns, tt.socks); got != tt.want {
			t.Errorf("%s: %d overflows, want %d", tt.name, got, tt.want)
		}
	}
}
