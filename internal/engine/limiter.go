package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/egress"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
)

// Limiter is a running limiter: its engine, the sockets it protects, the
// configuration in force and the goroutines that report on it. It is safe for
// concurrent use.
type Limiter struct {
	name string
	// requested is the mode asked for (ModeAuto, ModeBPF or ModeUserspace).
	requested string
	// userspace opens the engine a failed attach falls back to.
	userspace func(datagram.Config) (Engine, error)

	mu sync.Mutex
	// eng is the engine in force: in ModeAuto it may change from the BPF
	// filter to the userspace limiter when attaching fails.
	eng Engine
	// put is the setting in force.
	put Setting
	// conns are the sockets the engine protects.
	conns []*net.UDPConn
	// events reads the engine's reports of newly limited streams.
	events EventReader
	// ctl moves the opening total when the configuration makes it
	// adaptive (nil otherwise).
	ctl *backlog.Controller

	// learner learns the server's connection IDs and peers from what
	// quic-go writes, and teaches the engine in force.
	learner *egress.Learner
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
	// is logged once.
	warnMu    sync.Mutex
	preWarned string

	stop chan struct{}
	done sync.WaitGroup
}

// Setting is what a configuration puts in force on a limiter: the decision
// configuration, the logger to report through, and By, who put it there
// (opaque to the limiter: Restore compares it).
type Setting struct {
	Config datagram.Config
	Logger *zap.Logger
	By     any
}

// New opens the engine of mode for c and starts the limiter called name,
// reporting through logger. In ModeAuto, a BPF filter that does not load is
// replaced by the userspace limiter, with one warning that says why.
func New(name string, c datagram.Config, mode string, logger *zap.Logger) (*Limiter, error) {
	eng, fallback, err := Open(mode, c)
	if log := VerifierLog(err); len(log) > 0 {
		// The error is one line; the verifier's log, thousands of
		// lines, is for those who ask for it.
		logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
	} else if log := VerifierLog(fallback); len(log) > 0 {
		logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
	}
	if err != nil {
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	if fallback != nil {
		logger.Warn("rakelimit filters in userspace, in front of quic-go, because the BPF filter cannot be used here; "+
			KernelGrant, zap.String("limiter", name), zap.String("reason", fallback.Error()))
	}
	return start(name, mode, eng, Setting{Config: c, Logger: logger}, OpenUserspace)
}

// start runs the limiter on eng; userspace opens the engine of a fallback.
func start(name, mode string, eng Engine, put Setting, userspace func(datagram.Config) (Engine, error)) (*Limiter, error) {
	events, err := eng.Events()
	if err != nil {
		eng.Close()
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	l := &Limiter{name: name, requested: mode, userspace: userspace, eng: eng, put: put, events: events,
		stop: make(chan struct{})}
	l.learner, err = egress.NewLearner(eng, egress.Options{Lifetime: IDLifetime, OnOddID: l.oddID})
	if err != nil {
		events.Close()
		eng.Close()
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	l.effective(put.Config) // starts the controller of an adaptive total
	l.done.Add(3)
	go l.readEvents()
	go l.expireStreams()
	go l.steerTotal()
	return l, nil
}

// Name is the limiter's name.
func (l *Limiter) Name() string { return l.name }

// Requested is the mode the limiter was asked for.
func (l *Limiter) Requested() string { return l.requested }

// Engine returns the engine in force.
func (l *Limiter) Engine() Engine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng
}

// Mode is the mode the limiter runs in now: ModeBPF or ModeUserspace.
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
	l.conns = slices.DeleteFunc(l.conns, IsClosed)
	return l.put, l.addrs()
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
func (l *Limiter) Put(s Setting) (Setting, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctl := l.ctl
	if err := l.eng.Configure(l.effective(s.Config)); err != nil {
		l.ctl = ctl
		return Setting{}, fmt.Errorf("rakelimit %q: %w", l.name, err)
	}
	prev := l.put
	l.put = s
	if !Equal(prev.Config, s.Config) {
		s.Logger.Info("new settings in force", append([]zap.Field{zap.String("limiter", l.name),
			zap.Strings("listeners", l.addrs())}, SettingsFields(s.Config)...)...)
	}
	return prev, nil
}

// Restore puts prev back, unless a setting other than by's has replaced
// by's since: that undoes a configuration that is abandoned.
func (l *Limiter) Restore(prev Setting, by any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.put.By != by {
		return // a newer configuration has taken over
	}
	ctl := l.ctl
	if err := l.eng.Configure(l.effective(prev.Config)); err != nil {
		l.ctl = ctl
		l.put.Logger.Error("restoring the previous settings", zap.String("limiter", l.name), zap.Error(err))
		return
	}
	l.put = prev
}

// Equal reports whether two configurations would limit alike.
func Equal(a, b datagram.Config) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// Attach puts the limiter in front of conn and returns what quic-go must
// read from; attached is false when it already was. In ModeAuto, a BPF
// filter that cannot attach to the limiter's first socket gives way to the
// userspace limiter, with a warning.
func (l *Limiter) Attach(conn *net.UDPConn) (out net.PacketConn, attached bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Contains(l.conns, conn) {
		out, err = l.eng.Protect(conn, l.learner) // the same conn again
		return out, false, err
	}
	out, err = l.eng.Protect(conn, l.learner)
	if err != nil && l.requested == ModeAuto && l.eng.Mode() == ModeBPF && len(l.conns) == 0 {
		if serr := l.fallBack(err); serr != nil {
			return nil, false, fmt.Errorf("%w; and the userspace limiter: %w", err, serr)
		}
		out, err = l.eng.Protect(conn, l.learner)
	}
	if err != nil {
		return nil, false, err
	}
	l.conns = append(l.conns, conn)
	l.warnPrefilter(l.eng, l.put.Logger)
	return out, true, nil
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

// fallBack replaces a BPF filter that could not attach with the userspace
// limiter, on the configuration in force, and says so; l.mu must be held.
func (l *Limiter) fallBack(why error) error {
	c := l.put.Config
	if l.ctl != nil {
		c = withTotal(c, l.ctl.Cap())
	}
	u, err := l.userspace(c)
	if err != nil {
		return err
	}
	events, err := u.Events()
	if err != nil {
		u.Close()
		return err
	}
	old, oldEvents := l.eng, l.events
	l.eng, l.events = u, events
	l.learner.SetSink(u)
	oldEvents.Close() // readEvents moves on to the new reader
	old.Close()
	l.put.Logger.Warn("rakelimit filters in userspace, in front of quic-go, because the BPF filter cannot attach to the socket; "+
		KernelGrant, zap.String("limiter", l.name), zap.String("reason", why.Error()))
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
			if _, _, err := eng.ExpireLearned(IDLifetime); err != nil {
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
func StreamIdle(c datagram.Config) time.Duration {
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
