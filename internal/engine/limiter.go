package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
)

// Limiter is a running limiter: its engine, the sockets it protects, the
// configuration in force and the goroutines that report on it. It is safe for
// concurrent use.
type Limiter struct {
	name string
	// open opens the engine of a concrete mode, on a hash key (nil: a
	// fresh one), for a fallback when the
	// engine in force cannot attach (Mode.Open but in tests).
	open func(Mode, decide.Config, *sketch.HashKey) (Engine, error)

	mu sync.Mutex
	// eng is the engine in force: in a chain (ModeAuto) it may change
	// from one mode's engine to the next's, the BPF filter to the
	// userspace limiter, when attaching fails.
	eng Engine
	// put is the setting in force, with the mode asked for.
	put Setting
	// reads are the conns quic-go reads every socket handed to the
	// limiter through, protected or not: they pass every datagram until
	// the userspace limiter decides them, so that the limiter can move to
	// userspace on sockets already served.
	reads map[*net.UDPConn]*packetconn.Conn
	// conns are the sockets the engine protects.
	conns []*net.UDPConn
	// failed are the sockets the engine could not protect: served
	// unprotected, attached again at the next Put.
	failed []*net.UDPConn
	// events reads the engine's reports of newly limited streams.
	events EventReader
	// totals move the opening and the established totals when the
	// configuration makes them adaptive (see total.go).
	totals adaptiveTotals
	// overflows counts a userspace engine's queue overflows for the
	// controllers (steerTotal's goroutine alone uses it).
	overflows overflowCount

	// learner learns the server's connection IDs and peers from what
	// quic-go writes, and teaches the engine in force.
	learner *learn.Learner
	// oddIDs is set once the server sent connection IDs the engine cannot
	// verify (not quic-go's 4 bytes): verification is then off.
	oddIDs atomic.Bool

	// attachErrors counts sockets this limiter should protect and could
	// not.
	attachErrors atomic.Uint64
	// started and ended budget the log lines of streams that start and
	// stop being limited.
	started, ended logBudget
	// preWarned is the pre-filter failure logged last: the same failure
	// is logged once; so are the XDP program's interfaces without it
	// (xdpWarned, by name and reason) and its table's failure.
	warnMu         sync.Mutex
	preWarned      string
	xdpWarned      map[string]bool
	xdpTableWarned string

	stop chan struct{}
	done sync.WaitGroup
}

// Setting is what a configuration puts in force on a limiter: the decision
// configuration, the mode asked for (a name in the table of modes; empty
// keeps the one in force), the logger to report through, and By, who put it
// there (opaque to the limiter: Restore compares it). The mode asked for
// decides whether a socket the engine cannot attach to moves the limiter to
// the next mode of a chain (ModeAuto: the BPF filter to userspace) or is
// served unprotected (a concrete mode, ModeBPF); it does not change the
// engine in force.
//
// Options (where the XDP program runs) are those the limiter started with:
// like the engine, they change only with a restart, and Put keeps them.
type Setting struct {
	Config  decide.Config
	Mode    string
	Options Options
	Logger  *zap.Logger
	By      any
}

// New opens the engine of mode for c and starts the limiter called name,
// reporting through logger. In a chain (ModeAuto), a mode whose engine does
// not load (the BPF filter) is replaced by the next (the userspace limiter),
// with one warning that says why.
func New(name string, c decide.Config, mode string, logger *zap.Logger) (*Limiter, error) {
	return NewWith(name, Setting{Config: c, Mode: mode, Logger: logger})
}

// NewWith is New for the setting s: its configuration, mode, options and
// logger.
func NewWith(name string, s Setting) (*Limiter, error) {
	c, mode, logger := s.Config, s.Mode, s.Logger
	// The adaptive totals start before the engine opens, on the
	// configuration they steer.
	run, totals := steered(c, decide.Config{}, adaptiveTotals{})
	eng, skipped, err := Open(mode, run, s.Options)
	// The errors are one line; the verifier's log, thousands of lines,
	// is for those who ask for it.
	if log := VerifierLog(err); len(log) > 0 {
		logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
	}
	for _, s := range skipped {
		if log := VerifierLog(s.Err); len(log) > 0 {
			logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	if len(skipped) > 0 {
		first, reasons := skipped[0].Mode, make([]string, len(skipped))
		for i, s := range skipped {
			reasons[i] = s.Err.Error()
		}
		logger.Warn(fallbackMessage(modeOf(eng), first, "cannot be used here"), zap.String("limiter", name),
			zap.String("reason", strings.Join(reasons, "; ")))
	}
	return startWith(name, eng, Setting{Config: c, Mode: mode, Options: s.Options, Logger: logger}, totals, nil)
}

// fallbackMessage is the warning of a limiter that runs in mode to, since
// the engine of from, preferred, "cannot be used here" or "cannot attach to
// the socket"; it says what would give the process from's engine.
func fallbackMessage(to, from Mode, why string) string {
	msg := "rakelimit filters " + to.Filters + ", because " + from.Engine + " " + why
	if from.Grant != "" {
		msg += "; " + from.Grant
	}
	return msg
}

// startWith runs the limiter on eng, asked for by put, with the
// controllers of its adaptive totals (steered); open opens the engine of a
// fallback (nil: the mode's own Open).
func startWith(name string, eng Engine, put Setting, totals adaptiveTotals,
	open func(Mode, decide.Config, *sketch.HashKey) (Engine, error)) (*Limiter, error) {
	if open == nil {
		open = func(m Mode, c decide.Config, hk *sketch.HashKey) (Engine, error) {
			o := put.Options
			o.HashKey = hk
			return m.Open(c, o)
		}
	}
	events, err := eng.Events()
	if err != nil {
		eng.Close()
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	l := &Limiter{name: name, open: open, eng: eng, put: put, events: events, totals: totals,
		reads: map[*net.UDPConn]*packetconn.Conn{}, stop: make(chan struct{})}
	l.learner, err = learn.NewLearner(eng, learn.Options{Lifetime: IDLifetime, OnOddID: l.oddID})
	if err != nil {
		events.Close()
		eng.Close()
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	l.done.Add(3)
	go l.readEvents()
	go l.expireStreams()
	go l.steerTotal()
	return l, nil
}

// Name is the limiter's name.
func (l *Limiter) Name() string { return l.name }

// Requested is the mode the limiter is asked for by the setting in force.
func (l *Limiter) Requested() string { return l.Setting().Mode }

// Engine returns the engine in force.
func (l *Limiter) Engine() Engine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng
}

// Mode is the concrete mode the limiter runs in now: ModeXDP, ModeBPF or
// ModeUserspace.
func (l *Limiter) Mode() string { return l.Engine().Mode() }

// AttachError counts a socket the limiter should protect and could not;
// AttachErrors reads the count.
func (l *Limiter) AttachError()         { l.attachErrors.Add(1) }
func (l *Limiter) AttachErrors() uint64 { return l.attachErrors.Load() }

// Setting returns the setting in force.
func (l *Limiter) Setting() Setting {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.put
}

// Snapshot returns the setting in force and the addresses of the open
// sockets the limiter protects, forgetting those closed since (a reload
// that moved or removed a listener).
func (l *Limiter) Snapshot() (Setting, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetClosed()
	return l.put, l.addrs()
}

// forgetClosed forgets the sockets closed since they were handed to the
// limiter; l.mu must be held.
func (l *Limiter) forgetClosed() {
	for c := range l.reads {
		if IsClosed(c) {
			delete(l.reads, c)
		}
	}
	l.conns = slices.DeleteFunc(l.conns, IsClosed)
	l.failed = slices.DeleteFunc(l.failed, IsClosed)
	if f, ok := l.eng.(closedForgetter); ok {
		f.ForgetClosed()
	}
}

// closedForgetter is an engine that holds more than the sockets for them
// (the XDP program's listener tables and interfaces): ForgetClosed lets
// go of what it holds for the sockets closed since they were protected.
type closedForgetter interface {
	ForgetClosed()
}

// Unprotected returns the open sockets the limiter was handed and could
// not protect.
func (l *Limiter) Unprotected() []*net.UDPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetClosed()
	return slices.Clone(l.failed)
}

// Sockets returns the sockets the limiter protects.
func (l *Limiter) Sockets() []*net.UDPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.conns)
}

// addrs lists the sockets' addresses; l.mu must be held.
func (l *Limiter) addrs() []string {
	addrs := make([]string, len(l.conns))
	for i, c := range l.conns {
		addrs[i] = c.LocalAddr().String()
	}
	return addrs
}

// Put puts s in force, all or nothing, with one switch of the engine's
// configuration, logs new settings, and returns the setting it replaced.
// Then it attaches the engine again to the sockets it could not protect
// before, and in a chain (ModeAuto) falls back to its next mode if the
// engine still cannot attach.
func (l *Limiter) Put(s Setting) (Setting, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A configuration in force already is not put in force again.
	if totals := l.totals; !Equal(l.put.Config, s.Config) {
		if err := l.eng.Configure(l.effective(s.Config)); err != nil {
			l.totals = totals
			return Setting{}, fmt.Errorf("rakelimit %q: %w", l.name, err)
		}
	}
	prev := l.put
	if s.Mode == "" {
		s.Mode = prev.Mode
	}
	s.Options = prev.Options
	l.put = s
	if !Equal(prev.Config, s.Config) {
		s.Logger.Info("new settings in force", append([]zap.Field{zap.String("limiter", l.name),
			zap.Strings("listeners", l.addrs())}, SettingsFields(s.Config)...)...)
	}
	l.retry()
	return prev, nil
}

// retry attaches the engine to the open sockets it could not protect, and
// says what became of each; l.mu must be held.
func (l *Limiter) retry() {
	l.forgetClosed()
	for _, c := range slices.Clone(l.failed) {
		ln := zap.String("listener", c.LocalAddr().String())
		if err := l.protect(c); err != nil {
			l.attachErrors.Add(1)
			l.put.Logger.Error("listener still NOT protected", zap.String("limiter", l.name), ln, zap.Error(err))
			continue
		}
		l.put.Logger.Info("protecting listener", zap.String("limiter", l.name), ln, zap.String("mode", l.eng.Mode()))
	}
}

// Restore puts prev back, unless a setting other than by's has replaced
// by's since: that undoes a configuration that is abandoned.
func (l *Limiter) Restore(prev Setting, by any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.put.By != by {
		return // a newer configuration has taken over
	}
	totals := l.totals
	if err := l.eng.Configure(l.effective(prev.Config)); err != nil {
		l.totals = totals
		l.put.Logger.Error("restoring the previous settings", zap.String("limiter", l.name), zap.Error(err))
		return
	}
	l.put = prev
}

// Equal reports whether two configurations would limit alike.
func Equal(a, b decide.Config) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// Attach puts the limiter in front of conn and returns what quic-go must
// read from: a conn that embeds the socket, a *net.UDPConn, so that quic-go
// keeps its fast path (batched reads, GSO, ECN, path MTU discovery), and
// that teaches the learner what quic-go writes; attached is false when the
// limiter already protected conn. The conn passes every datagram while the
// BPF filter decides them in the kernel, and goes through the userspace
// limiter once it is in force, so that the whole limiter can move there.
//
// In a chain (ModeAuto), an engine that cannot attach to a socket, the
// first or a later one, gives way to the next mode's (the BPF filter to the
// userspace limiter) on every socket of the limiter, with a warning.
// Otherwise a socket the engine cannot protect is returned with the error:
// quic-go may serve it unprotected through the conn, and the next Put
// attaches again.
func (l *Limiter) Attach(conn *net.UDPConn) (out net.PacketConn, attached bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	read, known := l.reads[conn]
	switch {
	case known && slices.Contains(l.conns, conn):
		return read, false, nil // the same conn again
	case !known:
		if read, err = packetconn.New(conn); err != nil {
			return nil, false, fmt.Errorf("wrapping the socket: %w", err)
		}
		read.SetLearner(l.learner)
		l.reads[conn] = read
		l.failed = append(l.failed, conn) // until protect succeeds
	}
	if err := l.protect(conn); err != nil {
		return read, false, err
	}
	return read, true, nil
}

// protect puts the engine in front of conn, one of l.failed, falling back
// to the next modes of a chain (ModeAuto) in turn, and moves it to l.conns;
// l.mu must be held.
func (l *Limiter) protect(conn *net.UDPConn) error {
	err := l.eng.Protect(conn, l.reads[conn])
	next := fallbacks(l.put.Mode, l.eng.Mode())
	if len(next) == 0 && socketFilterOnly(err) {
		// Mode xdp fails closed: the socket filter protects the
		// listener; warnXDP says where the program does not run.
		err = nil
	}
	if err != nil && len(next) > 0 {
		for _, m := range next {
			serr := l.fallBack(m, err)
			if serr == nil {
				return nil // fallBack protected every socket
			}
			err = fmt.Errorf("%w; and %s: %w", err, m.Engine, serr)
		}
		return err
	}
	if err != nil {
		return err
	}
	l.failed = slices.DeleteFunc(l.failed, func(c *net.UDPConn) bool { return c == conn })
	l.conns = append(l.conns, conn)
	l.warnPrefilter(l.eng, l.put.Logger)
	l.warnXDP(l.eng, l.put.Logger)
	return nil
}

// warnPrefilter logs, once each, the failures of the engine's kernel
// pre-filter: the userspace limiter still decides every datagram.
func (l *Limiter) warnPrefilter(eng Engine, logger *zap.Logger) {
	pf, ok := eng.(Prefiltered)
	if !ok {
		return
	}
	err := pf.PrefilterError()
	if err == nil {
		return
	}
	l.warnMu.Lock()
	defer l.warnMu.Unlock()
	if err.Error() == l.preWarned {
		return
	}
	l.preWarned = err.Error()
	logger.Warn("the kernel pre-filter (classic BPF) could not be put on the socket; the userspace limiter still decides "+
		"every datagram it receives", zap.String("limiter", l.name), zap.Error(err))
}

// fallBack replaces an engine that could not attach with the engine of
// mode to (the BPF filter with the userspace limiter), on the configuration
// in force, on every socket handed to the limiter (those the old engine
// protects, which it then leaves, and those it could not protect), and says
// so; l.mu must be held. The settings and the connection IDs and peers
// learned carry over; the counts start afresh.
func (l *Limiter) fallBack(to Mode, why error) error {
	// The new engine hashes with the old one's key, so that what the old
	// one learned and what its clients proved carry over, found where the
	// old one put it: a client verified by its proven address or its
	// credit would not earn either again.
	hk := l.eng.HashKey()
	u, err := l.open(to, l.applied(), &hk)
	if err != nil {
		return err
	}
	u.AdoptLearned(l.eng.Learned())
	events, err := u.Events()
	if err != nil {
		u.Close()
		return err
	}
	old, oldEvents := l.eng, l.events
	// A socket has one kernel filter, the old engine's BPF program or the
	// new one's classic pre-filter: the old engine leaves each socket
	// before the new one protects it, since taking a filter away takes
	// whatever the socket has. That includes the sockets it could not
	// protect in full (mode xdp keeps the socket filter on a listener
	// whose interfaces refused the XDP program), whose filter would
	// otherwise charge the socket's option memory twice while the new one
	// replaces it, more than optmem_max allows.
	for _, conn := range slices.Concat(l.conns, l.failed) {
		if _, err := old.Unprotect(conn); err != nil {
			l.put.Logger.Debug("taking the filter away", zap.String("limiter", l.name), zap.Error(err))
		}
	}
	for conn, read := range l.reads {
		if err := u.Protect(conn, read); err != nil {
			for _, c := range l.conns { // put the old engine back
				if perr := old.Protect(c, l.reads[c]); perr != nil {
					l.put.Logger.Error("listener NOT protected", zap.String("limiter", l.name),
						zap.String("listener", c.LocalAddr().String()), zap.Error(perr))
				}
			}
			u.Close()
			return err
		}
	}
	moved := l.addrs()
	l.eng, l.events = u, events
	l.learner.SetSink(u)
	oldEvents.Close() // readEvents moves on to the new reader
	old.Close()
	l.conns = append(l.conns, l.failed...)
	l.failed = nil
	l.put.Logger.Warn(fallbackMessage(to, modeOf(old), "cannot attach to "+modeOf(old).AttachesTo), zap.String("limiter", l.name),
		zap.String("reason", why.Error()), zap.Strings("moved_listeners", moved))
	return nil
}

// readEvents logs each stream the engine starts limiting: one line per
// stream, however fast it floods, since the engine reports a stream once.
func (l *Limiter) readEvents() {
	defer l.done.Done()
	for {
		l.mu.Lock()
		events := l.events
		l.mu.Unlock()
		st, err := events.Read()
		if errors.Is(err, os.ErrClosed) {
			l.mu.Lock()
			same := l.events == events
			l.mu.Unlock()
			if same {
				return // closed for good
			}
			continue // the engine changed: read the new one
		}
		if err != nil {
			l.Setting().Logger.Error("reading limited streams", zap.String("limiter", l.name), zap.Error(err))
			continue
		}
		if !l.started.allow(time.Now(), streamKind(st)) {
			continue
		}
		put, listeners := l.Snapshot()
		msg := "limiting stream"
		if st.Class == quicclass.Invalid {
			msg = "dropping invalid datagrams"
		}
		if st.DryRun {
			msg = "dry run: would be " + msg
		}
		put.Logger.Warn(msg, l.streamFields(put.Config, st, listeners)...)
	}
}

// expireStreams forgets, every second, the streams with no drop for a while
// and logs that their limiting stopped, how long it lasted and how many
// packets it dropped; and sweeps the sketches hourly.
func (l *Limiter) expireStreams() {
	defer l.done.Done()
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	sweep := sweepEvery
	for {
		select {
		case <-l.stop:
			return
		case <-tk.C:
		}
		put, listeners := l.Snapshot()
		eng := l.Engine()
		l.warnPrefilter(eng, put.Logger)
		expired, err := eng.ExpireStreams(StreamIdle(put.Config))
		if err != nil {
			put.Logger.Error("expiring limited streams", zap.String("limiter", l.name), zap.Error(err))
		}
		for _, st := range expired {
			if l.ended.allow(time.Now(), streamKind(st)) {
				put.Logger.Info(expiredMessage(st), l.expiredFields(put.Config, st, listeners)...)
			}
		}
		l.logSummary(put.Logger, &l.started, "more streams started being limited than are logged one by one", listeners)
		l.logSummary(put.Logger, &l.ended, "more streams stopped being limited than are logged one by one", listeners)
		if sweep%expireLearnedEvery == 0 {
			if _, err := eng.ExpireLearned(IDLifetime); err != nil {
				put.Logger.Error("forgetting unused connection IDs and peers", zap.String("limiter", l.name), zap.Error(err))
			}
		}
		if sweep--; sweep <= 0 {
			sweep = sweepEvery
			if _, err := eng.Sweep(); err != nil {
				put.Logger.Error("sweeping the sketches", zap.String("limiter", l.name), zap.Error(err))
			}
		}
	}
}

// errNoQueue is a sample without a receive queue to read.
var errNoQueue = errors.New("no receive queue to read")

// sweepEvery is how many ticks of the expiry loop (seconds) pass between two
// sweeps of the sketches' stale cells (sketch.Limiter.Sweep): hourly, much
// more often than the 39 h after which a cell is stale.
const sweepEvery = 3600

// StreamIdle is how long a stream goes without a drop before it counts as
// no longer limited: two windows, and at least two seconds.
func StreamIdle(c decide.Config) time.Duration {
	return max(2*c.Limiter.Window, 2*time.Second)
}

// Close stops the reporting goroutines, takes the engine away from the
// sockets that are still open (the limiter was removed from them) and closes
// it.
func (l *Limiter) Close() error {
	close(l.stop)
	l.mu.Lock()
	events := l.events
	l.mu.Unlock()
	events.Close()
	l.done.Wait()
	l.learner.SetSink(nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		open, err := l.eng.Unprotect(c)
		switch {
		case err != nil:
			l.put.Logger.Debug("taking the filter away", zap.String("limiter", l.name), zap.Error(err))
		case open:
			l.put.Logger.Warn("rakelimit removed from the configuration: listener no longer protected",
				zap.String("limiter", l.name), zap.String("listener", c.LocalAddr().String()))
		}
	}
	return l.eng.Close()
}
