package engine

import (
	"maps"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
)

// The opening total, when the configuration makes it adaptive, follows the
// sockets' receive queues (package backlog): steerTotal samples them every
// backlog.Period and puts each new total in force.

// OpeningTotal describes the opening total in force.
type OpeningTotal struct {
	// Adaptive is true when the total follows the receive queue.
	Adaptive bool
	// Cap is the total in packets per second, 0 when lifted.
	Cap uint32
	// Last is what the controller saw in its last period.
	Last backlog.Reading
}

// OpeningTotal returns the opening total in force.
func (l *Limiter) OpeningTotal() OpeningTotal {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.put.Config
	if l.ctl == nil {
		return OpeningTotal{Cap: LevelLimit(c, 0, c.Limiter.WithDefaults().Levels()-1)}
	}
	return OpeningTotal{Adaptive: true, Cap: l.ctl.Cap(), Last: l.ctl.Last()}
}

// withTotal returns c with the opening total at cap (backlog.Unlimited:
// lifted).
func withTotal(c decide.Config, cap uint32) decide.Config {
	top := c.Limiter.WithDefaults().Levels() - 1
	c.Limiter.LevelLimits = maps.Clone(c.Limiter.LevelLimits)
	if c.Limiter.LevelLimits == nil {
		c.Limiter.LevelLimits = map[int]uint32{}
	}
	if cap == backlog.Unlimited {
		c.Limiter.LevelLimits[top] = sketch.Unlimited
	} else {
		c.Limiter.LevelLimits[top] = cap
	}
	return c
}

// effective is the configuration the engine runs for c: c, with the
// adaptive total at the controller's value and verification off when the
// server's connection IDs cannot be verified; l.mu must be held. A new
// setting that makes the total adaptive starts the controller at its level
// limit; one that makes it fixed stops it.
func (l *Limiter) effective(c decide.Config) decide.Config {
	c.VerifyIDs = c.VerifyIDs && !l.oddIDs.Load()
	if !c.AdaptiveTotal {
		l.ctl = nil
		return c
	}
	if l.ctl == nil || !l.put.Config.AdaptiveTotal {
		start := LevelLimit(c, 0, c.Limiter.WithDefaults().Levels()-1)
		l.ctl = backlog.NewController(backlog.LawFor(c.Limiter), start)
	}
	return withTotal(c, l.ctl.Cap())
}

// logEvery bounds the lines steerTotal logs: one per change of state
// (limited, lifted; shedding, not) at most every logEvery.
const logEvery = 10 * time.Second

// stateLog tells when a change of state is worth a line.
type stateLog struct {
	was  bool
	last time.Time
}

// changed reports whether the state is now on, having been off, or the
// reverse, and no line was logged for logEvery; it then records the line.
func (s *stateLog) changed(on bool, now time.Time) bool {
	if on == s.was || now.Sub(s.last) < logEvery {
		return false
	}
	s.was, s.last = on, now
	return true
}

// steerTotal runs the control loop of an adaptive opening total, and the
// userspace mode's shed of long headers (shed).
func (l *Limiter) steerTotal() {
	defer l.done.Done()
	tk := time.NewTicker(backlog.Period)
	defer tk.Stop()
	base := time.Now()
	var total, shedding stateLog
	for {
		select {
		case <-l.stop:
			return
		case <-tk.C:
		}
		s, st, err := l.sample(int64(time.Since(base)))
		if err != nil {
			continue // no queue to read (not Linux, or no socket yet): the total stays where it is
		}
		l.shed(s, st, &shedding)
		l.mu.Lock()
		if l.ctl == nil {
			l.mu.Unlock()
			continue
		}
		cap, changed := l.ctl.Step(s)
		if changed {
			if err := l.eng.Configure(withTotal(l.put.Config, cap)); err != nil {
				l.put.Logger.Error("moving the opening total", zap.String("limiter", l.name), zap.Error(err))
			}
		}
		logger, last := l.put.Logger, l.ctl.Last()
		l.mu.Unlock()
		limited := cap != backlog.Unlimited
		if !total.changed(limited, time.Now()) {
			continue
		}
		fields := []zap.Field{zap.String("limiter", l.name), zap.Float64("receive_queue_fill", last.Fill),
			zap.Uint64("receive_queue_drops", last.Overflows), zap.Float64("opening_pps", last.OpenedPPS)}
		if limited {
			logger.Warn("quic-go falls behind its receive queue: the opening total caps connection-opening packets",
				append(fields, zap.Uint32("opening_total_pps", cap))...)
		} else {
			logger.Info("quic-go keeps up with its receive queue: the opening total is lifted", fields...)
		}
	}
}

// shed steps the pre-filter's shed of long headers, for an engine that
// has one, and logs when it starts and ends.
func (l *Limiter) shed(s backlog.Sample, st decide.Stats, log *stateLog) {
	pf, ok := l.Engine().(Prefiltered)
	if !ok {
		return
	}
	r, changed := pf.Shed(s, st)
	if !changed || !log.changed(r.Drop > 0, time.Now()) {
		return
	}
	fields := []zap.Field{zap.String("limiter", l.name), zap.Float64("receive_queue_fill", r.Fill),
		zap.Uint64("receive_queue_drops", r.Overflows), zap.Float64("received_pps", r.ReceivedPPS),
		zap.Float64("long_header_share", r.LongShare)}
	l.mu.Lock()
	logger := l.put.Logger
	l.mu.Unlock()
	if r.Drop > 0 {
		logger.Warn("the receive queue overflows: the pre-filter sheds connection-opening packets in the kernel",
			append(fields, zap.Float64("shed_probability", r.Drop))...)
	} else {
		logger.Info("the receive queue keeps up: the pre-filter sheds no connection-opening packets", fields...)
	}
}

// overflowCount counts the overflows of a userspace engine's receive queues:
// each period, the smaller of the increase of the network namespace's
// receive-buffer errors (/proc/net/snmp and snmp6: exact, but of every UDP
// socket) and of the sockets' drops (exact, but the pre-filter's among
// them). Only steerTotal's goroutine uses it.
type overflowCount struct {
	have      bool
	ns, socks uint64
	total     uint64
}

// add takes the counters now and returns the overflows counted so far.
func (o *overflowCount) add(ns, socks uint64) uint64 {
	if o.have && ns >= o.ns && socks >= o.socks {
		o.total += min(ns-o.ns, socks-o.socks)
	}
	o.ns, o.socks, o.have = ns, socks, true
	return o.total
}

// sample reads the sockets and the counters for the controllers; it
// returns the engine's counters it read.
func (l *Limiter) sample(at int64) (backlog.Sample, decide.Stats, error) {
	queued, capacity, drops, err := backlog.ReadSockets(l.Sockets())
	if err != nil || capacity == 0 {
		return backlog.Sample{}, decide.Stats{}, errNoQueue
	}
	eng := l.Engine()
	st, err := eng.Stats()
	if err != nil {
		return backlog.Sample{}, decide.Stats{}, err
	}
	s := backlog.Sample{At: at, Queued: queued, Capacity: capacity}
	var refused uint64
	for fam := range decide.Families {
		s.Opened += st.Passed[0][fam]
		for class := range st.Dropped {
			s.Received += st.Passed[class][fam]
			for _, n := range st.Dropped[class][fam] {
				refused += n
				if class == int(quicclass.Opening) {
					s.Long += n
				}
			}
		}
		s.Long += st.Passed[quicclass.Opening][fam]
		for _, n := range st.Invalid[0][fam] {
			refused += n
		}
		s.Received += st.Negotiation[fam][0] + st.Allowed[fam]
		refused += st.Negotiation[fam][1]
	}
	s.Received += refused
	// The kernel counts a socket filter's refusals among the socket's
	// drops (the table of modes says which engines are one); the userspace
	// limiter refuses what was already received, but its classic BPF
	// pre-filter refuses in the kernel (estimated).
	switch pf, ok := eng.(Prefiltered); {
	case modeOf(eng).RefusalsInSocketDrops:
		s.Overflows = max(drops, refused) - refused
	case ok:
		// The pre-filter's drops are estimated: the namespace's
		// receive-buffer errors, when readable, bound the overflows
		// exactly.
		pre := pf.KernelDropped(st)
		if c, err := backlog.ReadUDPCounters(); err == nil {
			s.Overflows = l.overflows.add(c.RcvbufErrors+c.RcvbufErrors6, drops)
		} else {
			s.Overflows = max(drops, pre) - pre
		}
	default:
		s.Overflows = drops
	}
	return s, st, nil
}
