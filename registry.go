package rakelimit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// limiters is the registry of what outlives a configuration: the loaded
// filters, by limiter name, and the sockets they are attached to. Caddy keeps
// a listener's socket across reloads without calling the wrappers again, so
// the filter must outlive the module instance that created it. The metrics
// collector and the admin API read it.
var limiters = &limiterRegistry{pool: caddy.NewUsagePool(), owners: map[*net.UDPConn]*limiter{}}

type limiterRegistry struct {
	// pool holds one *limiter per name, counted by the module instances
	// that use it; the last one to go destroys it.
	pool *caddy.UsagePool

	mu sync.Mutex
	// owners maps each attached socket to its limiter.
	owners map[*net.UDPConn]*limiter

	// collectionErrors counts failed reads of a filter's counters.
	collectionErrors atomic.Uint64
}

// limiter is a loaded filter, what it protects, and the goroutines that
// report on it.
type limiter struct {
	name string
	// requested is the mode the configuration asked for (ModeAuto,
	// ModeBPF or ModeUserspace).
	requested string

	mu sync.Mutex
	// filter is the engine in force: the BPF filter or the userspace
	// limiter (ModeAuto may switch to the latter when attaching fails).
	filter engine
	logger *zap.Logger
	// set is the configuration in force; appliedBy the app that put it
	// there (nil: loaded with it).
	set       settings
	appliedBy *App
	// loadID and loadSet record the configuration load that last
	// provisioned a wrapper of this name and its settings, to catch two
	// wrappers of one load that disagree.
	loadID  any
	loadSet settings
	// conns are the sockets the filter is attached to.
	conns []*net.UDPConn
	// attachErrors counts sockets this limiter should protect and could
	// not.
	attachErrors atomic.Uint64

	// events reads the filter's reports of newly limited streams.
	events eventReader
	stop   chan struct{}
	done   sync.WaitGroup
}

// acquire returns the limiter called name, loading its filter with s in
// mode if it does not exist yet. The caller must release it.
func (reg *limiterRegistry) acquire(name string, s settings, mode string, logger *zap.Logger) (*limiter, error) {
	v, _, err := reg.pool.LoadOrNew(name, func() (caddy.Destructor, error) {
		return newLimiter(name, s, mode, logger)
	})
	if err != nil {
		return nil, err
	}
	return v.(*limiter), nil
}

// release drops one use of the limiter called name.
func (reg *limiterRegistry) release(name string) error {
	_, err := reg.pool.Delete(name)
	return err
}

// each calls fn for every live limiter.
func (reg *limiterRegistry) each(fn func(*limiter)) {
	reg.pool.Range(func(_, v any) bool {
		fn(v.(*limiter))
		return true
	})
}

func newLimiter(name string, s settings, mode string, logger *zap.Logger) (*limiter, error) {
	eng, fallback, err := openEngine(mode, s)
	if log := verifierLog(err); len(log) == 0 {
		log = verifierLog(fallback)
		if len(log) > 0 {
			// The error is one line; the verifier's log, thousands of
			// lines, is for those who ask for it.
			logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
		}
	} else {
		logger.Debug("the kernel verifier's log", zap.String("limiter", name), zap.Strings("log", log))
	}
	if err != nil {
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	if fallback != nil {
		logger.Warn("rakelimit filters in userspace, in front of quic-go, because the BPF filter cannot be used here; "+
			kernelGrant, zap.String("limiter", name), zap.String("reason", fallback.Error()))
	}
	events, err := eng.events()
	if err != nil {
		eng.Close()
		return nil, fmt.Errorf("rakelimit %q: %w", name, err)
	}
	l := &limiter{name: name, requested: mode, filter: eng, logger: logger, set: s, events: events, stop: make(chan struct{})}
	l.done.Add(2)
	go l.readEvents()
	go l.expireStreams()
	return l, nil
}

// engine returns the engine in force.
func (l *limiter) engine() engine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.filter
}

// modeNow returns the mode the limiter runs in: ModeBPF or ModeUserspace.
func (l *limiter) modeNow() string { return l.engine().mode() }

// provision checks that s, in mode, can govern the limiter in the
// configuration load loadID and queues the change with app.
func (l *limiter) provision(app *App, loadID any, s settings, mode string, logger *zap.Logger) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loadID == loadID && !l.loadSet.equal(s) {
		return fmt.Errorf("rakelimit %q is configured twice in this configuration with different settings "+
			"(limit %d window %v, and limit %d window %v, or other options): sites on one listener must agree; "+
			"limiters that differ need distinct names",
			l.name, l.loadSet.Limiter.Limit, l.loadSet.Limiter.Window, s.Limiter.Limit, s.Limiter.Window)
	}
	next, err := sketch.Compile(s.Limiter)
	if err != nil {
		return err
	}
	if !l.filter.Params().SameShape(next) {
		return fmt.Errorf("rakelimit %q: the number of prefixes and per_destination_port cannot change "+
			"while its listeners run; restart Caddy, or use a new name on a new listener address", l.name)
	}
	if running := l.filter.mode(); mode != ModeAuto && mode != running {
		return fmt.Errorf("rakelimit %q runs in %s mode, and mode %s cannot take over its running listeners; "+
			"restart Caddy to change the mode (mode auto keeps the one running)", l.name, running, mode)
	}
	l.loadID, l.loadSet = loadID, s
	var prev settings
	var prevBy *App
	var prevLogger *zap.Logger
	app.queue(commit{
		apply: func() error {
			l.mu.Lock()
			defer l.mu.Unlock()
			if err := l.apply(s); err != nil {
				return err
			}
			prev, prevBy, prevLogger = l.set, l.appliedBy, l.logger
			l.set, l.appliedBy, l.logger = s, app, logger
			if !prev.equal(s) {
				logger.Info("new settings in force", append([]zap.Field{zap.String("limiter", l.name),
					zap.Strings("listeners", l.addrs())}, settingsFields(s)...)...)
			}
			return nil
		},
		revert: func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.appliedBy != app {
				return // a newer configuration has taken over
			}
			if err := l.apply(prev); err != nil {
				l.logger.Error("restoring the previous settings", zap.String("limiter", l.name), zap.Error(err))
				return
			}
			l.set, l.appliedBy, l.logger = prev, prevBy, prevLogger
		},
	})
	return nil
}

// apply puts s in force on the filter, all or nothing, with one switch of
// its configuration.
func (l *limiter) apply(s settings) error {
	if err := l.filter.Configure(datagram.Config(s)); err != nil {
		return fmt.Errorf("rakelimit %q: %w", l.name, err)
	}
	return nil
}

// settingsFields are the log fields that describe s.
func settingsFields(s settings) []zap.Field {
	c := s.Limiter.WithDefaults()
	levels := func(class int) []string {
		out := make([]string, c.Levels())
		for lvl := range out {
			if lim := levelLimit(s, class, lvl); lim == 0 {
				out[lvl] = "off"
			} else {
				out[lvl] = strconv.FormatUint(uint64(lim), 10)
			}
		}
		return out
	}
	fields := []zap.Field{zap.Uint32("limit", c.Limit), zap.Duration("window", c.Window),
		zap.Strings("level_limits", levels(0)), zap.Bool("classify", s.Classify)}
	if s.Classify {
		fields = append(fields, zap.Strings("established_level_limits", levels(1)),
			zap.Uint32("version_negotiation", s.Negotiation))
	}
	return append(fields, zap.Bool("dry_run", s.DryRun), zap.Int("allowlisted_prefixes", len(s.Allow)))
}

// attach puts the filter in front of conn, unless it already is, and
// returns what quic-go must read from. A socket has one filter: one that
// another limiter protects is left alone. In mode auto, a BPF filter that
// cannot attach to the limiter's first socket gives way to the userspace
// limiter.
func (l *limiter) attach(conn *net.UDPConn) (out net.PacketConn, attached bool, err error) {
	limiters.mu.Lock()
	defer limiters.mu.Unlock()
	switch owner := limiters.owners[conn]; {
	case owner == l:
		out, err = l.engine().protect(conn) // already protected: the same conn again
		return out, false, err
	case owner != nil:
		return nil, false, fmt.Errorf("the socket is already limited by rakelimit %q", owner.name)
	}
	out, err = l.engine().protect(conn)
	if err != nil && l.requested == ModeAuto && l.modeNow() == ModeBPF && len(l.socketsNow()) == 0 {
		if serr := l.switchToUserspace(err); serr != nil {
			return nil, false, fmt.Errorf("%w; and the userspace limiter: %w", err, serr)
		}
		out, err = l.engine().protect(conn)
	}
	if err != nil {
		return nil, false, err
	}
	limiters.owners[conn] = l
	l.mu.Lock()
	l.conns = append(l.conns, conn)
	l.mu.Unlock()
	return out, true, nil
}

// switchToUserspace replaces a BPF filter that could not attach with the
// userspace limiter, on the settings in force, and says so.
func (l *limiter) switchToUserspace(why error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	u, err := newUserEngine(datagram.Config(l.set))
	if err != nil {
		return err
	}
	events, err := u.events()
	if err != nil {
		u.Close()
		return err
	}
	old, oldEvents := l.filter, l.events
	l.filter, l.events = u, events
	oldEvents.Close() // readEvents moves on to the new reader
	old.Close()
	l.logger.Warn("rakelimit filters in userspace, in front of quic-go, because the BPF filter cannot attach to the socket; "+
		kernelGrant, zap.String("limiter", l.name), zap.String("reason", why.Error()))
	return nil
}

// socketsNow returns the sockets the limiter protects.
func (l *limiter) socketsNow() []*net.UDPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.conns)
}

// snapshot returns the settings in force, the logger and the addresses of
// the open sockets the filter is attached to.
func (l *limiter) snapshot() (settings, *zap.Logger, []string) {
	l.forgetClosed()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.set, l.logger, l.addrs()
}

// addrs lists the sockets' addresses; l.mu must be held.
func (l *limiter) addrs() []string {
	addrs := make([]string, len(l.conns))
	for i, c := range l.conns {
		addrs[i] = c.LocalAddr().String()
	}
	return addrs
}

// forgetClosed drops the sockets that Caddy has closed since the filter was
// attached (a reload that moved or removed a listener) from the limiter and
// the registry: they no longer appear in the admin view or the metrics.
func (l *limiter) forgetClosed() {
	limiters.mu.Lock()
	defer limiters.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns = slices.DeleteFunc(l.conns, func(c *net.UDPConn) bool {
		if !isClosed(c) {
			return false
		}
		if limiters.owners[c] == l {
			delete(limiters.owners, c)
		}
		return true
	})
}

// isClosed reports whether conn's socket has been closed.
func isClosed(conn *net.UDPConn) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}

// ownerOf returns the limiter attached to the open socket that matches, and
// whether there is one.
func (reg *limiterRegistry) ownerOf(match func(*net.UDPConn) bool) (*limiter, bool) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for c, l := range reg.owners {
		if !isClosed(c) && match(c) {
			return l, true
		}
	}
	return nil, false
}

// levelLimit is the limit in packets per second of a level of a class under
// s, or 0 when the level is unlimited.
func levelLimit(s settings, class, level int) uint32 {
	c := s.Limiter.Class(class)
	lim := c.Limit
	if l, ok := c.LevelLimits[level]; ok {
		lim = l
	}
	if lim == sketch.Unlimited {
		return 0
	}
	return lim
}

// describe names a tracked stream as an operator reads it, with its rate in
// packets per second (0 for invalid datagrams, which are not measured).
func (l *limiter) describe(st datagram.Stream) (string, float64) {
	p := l.engine().Params()
	if st.Class == quicclass.Invalid {
		return st.Key.Addr().String() + " -> :" + strconv.Itoa(int(st.Key.DstPort)), 0
	}
	return st.Node.Stream(p, &st.Key), p.PPS(st.Estimate)
}

// className names the limiter class of a stream or counter: opening and
// established when the filter classifies, all when it does not.
func className(s settings, class quicclass.Class) string {
	if !s.Classify && class == quicclass.Opening {
		return "all"
	}
	return class.String()
}

// streamFields are the log fields of a stream.
func (l *limiter) streamFields(s settings, st datagram.Stream, listeners []string) []zap.Field {
	stream, rate := l.describe(st)
	fields := []zap.Field{zap.String("limiter", l.name), zap.Strings("listeners", listeners),
		zap.String("stream", stream), zap.String("class", className(s, st.Class))}
	if st.Class == quicclass.Invalid {
		return append(fields, zap.String("reason", st.Reason.String()))
	}
	// "lattice_level", not "level": Caddy's JSON log keeps its severity
	// under "level".
	return append(fields, zap.Int("lattice_level", st.Level), zap.Float64("rate_pps", rate),
		zap.Uint32("limit_pps", levelLimit(s, int(st.Class), st.Level)))
}

// readEvents logs each stream the kernel starts limiting: one line per
// stream, however fast it floods, since the kernel reports a stream once.
func (l *limiter) readEvents() {
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
		set, logger, listeners := l.snapshot()
		if err != nil {
			logger.Error("reading limited streams", zap.String("limiter", l.name), zap.Error(err))
			continue
		}
		msg := "limiting stream"
		if st.Class == quicclass.Invalid {
			msg = "dropping invalid datagrams"
		}
		if st.DryRun {
			msg = "dry run: would be " + msg
		}
		logger.Warn(msg, l.streamFields(set, st, listeners)...)
	}
}

// expireStreams forgets, every second, the streams with no drop for a while
// and logs that their limiting stopped, how long it lasted and how many
// packets it dropped.
func (l *limiter) expireStreams() {
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
		set, logger, listeners := l.snapshot() // also forgets closed sockets
		expired, err := l.engine().ExpireStreams(streamIdle(set))
		if err != nil {
			logger.Error("expiring limited streams", zap.String("limiter", l.name), zap.Error(err))
		}
		for _, st := range expired {
			stream, _ := l.describe(st)
			dropped := "dropped"
			if st.DryRun {
				dropped = "would_drop"
			}
			msg := "stream no longer limited"
			if st.Class == quicclass.Invalid {
				msg = "no more invalid datagrams"
			}
			fields := []zap.Field{zap.String("limiter", l.name), zap.Strings("listeners", listeners),
				zap.String("stream", stream), zap.String("class", className(set, st.Class))}
			if st.Class == quicclass.Invalid {
				fields = append(fields, zap.String("reason", st.Reason.String()))
			} else {
				fields = append(fields, zap.Int("lattice_level", st.Level))
			}
			logger.Info(msg, append(fields, zap.Duration("duration", st.Last.Sub(st.First)), zap.Uint64(dropped, st.Drops))...)
		}
		if sweep--; sweep <= 0 {
			sweep = sweepEvery
			if _, err := l.engine().Sweep(); err != nil {
				logger.Error("sweeping the sketches", zap.String("limiter", l.name), zap.Error(err))
			}
		}
	}
}

// sweepEvery is how many ticks of the expiry loop (seconds) pass between two
// sweeps of the sketches' stale cells (sketch.Limiter.Sweep): hourly, much
// more often than the 39 h after which a cell is stale.
const sweepEvery = 3600

// streamIdle is how long a stream goes without a drop before it counts as
// no longer limited: two windows, and at least two seconds.
func streamIdle(s settings) time.Duration {
	return max(2*s.Limiter.Window, 2*time.Second)
}

// Destruct stops the reporting goroutines, takes the filter away from the
// sockets that are still open (the wrapper was removed from them) and closes
// it.
func (l *limiter) Destruct() error {
	close(l.stop)
	l.mu.Lock()
	events := l.events
	l.mu.Unlock()
	events.Close()
	l.done.Wait()
	limiters.mu.Lock()
	for _, c := range l.conns {
		if limiters.owners[c] == l {
			delete(limiters.owners, c)
		}
	}
	limiters.mu.Unlock()
	eng := l.engine()
	for _, c := range l.conns {
		open, err := eng.unprotect(c)
		switch {
		case err != nil:
			l.logger.Debug("taking the filter away", zap.String("limiter", l.name), zap.Error(err))
		case open:
			l.logger.Warn("rakelimit removed from the configuration: listener no longer protected",
				zap.String("limiter", l.name), zap.String("listener", c.LocalAddr().String()))
		}
	}
	return eng.Close()
}
