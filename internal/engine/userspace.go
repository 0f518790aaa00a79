package engine

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

// userEngine is the userspace limiter, with the packet conns it filters and
// the kernel pre-filter on their sockets (package prefilter).
type userEngine struct {
	*userspace.Decider

	mu    sync.Mutex
	conns map[*net.UDPConn]userspaceReads
	// pre keeps the classic BPF pre-filter of the sockets; preErr is an
	// error to report: a socket it could not attach to, or an update
	// that failed.
	pre    *prefilter.Enforcer
	preErr error
	// shedder steers the pre-filter's shed of long headers from the
	// receive queues (Shed).
	shedder *backlog.Shedder
	// stop ends the goroutine that updates the pre-filter; done says it
	// ended.
	stop, done chan struct{}
	once       sync.Once
}

// OpenUserspace opens the userspace limiter for c.
func OpenUserspace(c decide.Config, o Options) (Engine, error) {
	l, err := userspace.New(c, o.HashKey)
	if err != nil {
		return nil, err
	}
	e := &userEngine{Decider: l, conns: map[*net.UDPConn]userspaceReads{}, pre: prefilter.NewEnforcer(),
		shedder: backlog.NewShedder(backlog.DefaultShedLaw), stop: make(chan struct{}), done: make(chan struct{})}
	go e.enforce()
	return e, nil
}

func (e *userEngine) Mode() string { return ModeUserspace }

func (e *userEngine) Events() (EventReader, error) { return e.Decider.Events() }

// Configure puts c in force, then on the pre-filter.
func (e *userEngine) Configure(c decide.Config) error {
	if err := e.Decider.Configure(c); err != nil {
		return err
	}
	e.updatePrefilter()
	return nil
}

// userspaceReads is the conn quic-go reads a socket through as the
// userspace limiter takes it: a packetconn.Conn, whose reads the limiter
// decides once SetDecider puts it there (loaded once per read, one call
// per batch of datagrams).
type userspaceReads interface {
	ReadConn
	SetDecider(packetconn.Decider)
}

var _ userspaceReads = (*packetconn.Conn)(nil)

// Protect makes the userspace limiter decide every datagram quic-go reads
// through read, the socket's conn, which keeps quic-go's batched reads, GSO
// and ECN (see package userspace). It puts the pre-filter on the socket; if
// that fails the conn still protects it, and PrefilterError reports why.
func (e *userEngine) Protect(conn *net.UDPConn, read ReadConn) error {
	if read == nil {
		return errors.New("no conn to filter the socket's reads")
	}
	ur, ok := read.(userspaceReads)
	if !ok {
		return fmt.Errorf("the conn quic-go reads socket %v through (%T) cannot be filtered in userspace", conn.LocalAddr(), read)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.conns[conn] = ur
	ur.SetDecider(e.Decider)
	if err := e.pre.Attach(conn, e.Decider.Config()); err != nil {
		e.preErr = fmt.Errorf("socket %v: %w", conn.LocalAddr(), err)
	}
	return nil
}

// PrefilterError returns, once, the latest failure to attach or update the
// pre-filter.
func (e *userEngine) PrefilterError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.preErr
	e.preErr = nil
	return err
}

// Prefilter says what the pre-filter does.
func (e *userEngine) Prefilter() prefilter.Status { return e.pre.Status() }

// KernelDropped estimates what the pre-filter dropped, its shed brought up
// to st, the limiter's counters now.
func (e *userEngine) KernelDropped(st decide.Stats) uint64 {
	e.pre.Account(st)
	return e.pre.Status().Dropped()
}

// Shed steps the shedder with s, a sample of the sockets whose Overflows
// leave out the pre-filter's drops, and st, the limiter's counters it was
// taken with, and puts the drop probability of long headers it returns on
// the pre-filter. A dry run, or a configuration that does not classify
// (the program cannot tell a long header), sheds nothing.
func (e *userEngine) Shed(s backlog.Sample, st decide.Stats) (backlog.ShedReading, bool) {
	c := e.Decider.Config()
	e.mu.Lock()
	if c.DryRun || !c.Classify {
		e.shedder = backlog.NewShedder(backlog.DefaultShedLaw)
	} else {
		e.shedder.Step(s)
	}
	r := e.shedder.Last()
	e.mu.Unlock()
	if !e.pre.SetShed(r.Drop, st) {
		return r, false
	}
	e.updatePrefilter()
	return r, true
}

// enforce updates the pre-filter every prefilter.Period from the streams
// the limiter drops, and every prefilter.OnsetPeriod while a flood begins
// (onset).
func (e *userEngine) enforce() {
	defer close(e.done)
	var o onset
	tm := time.NewTimer(prefilter.Period)
	defer tm.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case <-e.Decider.Tracked():
			if !o.tracked(time.Now()) {
				continue
			}
			// A flood begins: update at once, unless just done,
			// and then every OnsetPeriod.
			if wait := prefilter.OnsetPeriod - time.Since(last); wait > 0 {
				tm.Reset(wait)
				continue
			}
		case <-tm.C:
		}
		e.updatePrefilter()
		last = time.Now()
		tm.Reset(o.period(last))
	}
}

// onset tells when a flood begins: a stream starts being tracked after none
// did for 2*prefilter.Period.
type onset struct {
	lastTracked, began time.Time
}

// tracked records that a stream started being tracked at now and reports
// whether a flood began then.
func (o *onset) tracked(now time.Time) bool {
	began := o.lastTracked.IsZero() || now.Sub(o.lastTracked) > 2*prefilter.Period
	o.lastTracked = now
	if began {
		o.began = now
	}
	return began
}

// period is the time to the next update after one at now.
func (o *onset) period(now time.Time) time.Duration {
	if !o.began.IsZero() && now.Sub(o.began) < prefilter.OnsetTime {
		return prefilter.OnsetPeriod
	}
	return prefilter.Period
}

// updatePrefilter compiles the configuration and the limited streams into
// the pre-filter.
func (e *userEngine) updatePrefilter() {
	streams, _ := e.Decider.Streams()
	st, _ := e.Decider.Stats()
	fair := e.Decider.FairStreams()
	if err := e.pre.Update(e.Decider.Config(), e.Decider.Params(), streams, fair, e.Decider.Returning(),
		e.Decider.Rate, st, time.Now()); err != nil {
		e.mu.Lock()
		e.preErr = err
		e.mu.Unlock()
	}
}

// Unprotect lets every datagram through the socket's conn and takes the
// pre-filter away: quic-go keeps reading through the conn until the socket
// closes.
func (e *userEngine) Unprotect(conn *net.UDPConn) (bool, error) {
	e.mu.Lock()
	c, ok := e.conns[conn]
	delete(e.conns, conn)
	e.mu.Unlock()
	if !ok {
		return false, errors.New("not a socket of this limiter")
	}
	c.SetDecider(nil)
	open := !IsClosed(conn)
	if err := e.pre.Detach(conn); err != nil && open {
		return open, err
	}
	return open, nil
}

// Close stops updating the pre-filter and closes the limiter.
func (e *userEngine) Close() error {
	e.once.Do(func() { close(e.stop) })
	<-e.done
	return e.Decider.Close()
}

// IsClosed reports whether conn's socket has been closed.
func IsClosed(conn *net.UDPConn) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}

// Prefiltered is an engine with a kernel pre-filter (the userspace one).
type Prefiltered interface {
	// Prefilter says what the pre-filter does.
	Prefilter() prefilter.Status
	// PrefilterError returns, once, the latest failure to attach or
	// update it.
	PrefilterError() error
	// KernelDropped estimates what the pre-filter dropped, brought up to
	// st, the limiter's counters now: the socket's drop count holds them
	// and the queue's overflows.
	KernelDropped(st decide.Stats) uint64
	// Shed steers the pre-filter's shed of long headers with a sample of
	// the receive queues (package backlog's Shedder) and st, the
	// limiter's counters it was taken with; it returns what the step saw
	// and whether the drop probability changed.
	Shed(s backlog.Sample, st decide.Stats) (backlog.ShedReading, bool)
}
