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

// The opening and the established totals, when the configuration makes
// them adaptive, follow the sockets' receive queues (package backlog):
// steerTotal samples them every backlog.Period and puts each new total in
// force. The opening total starts at its level limit, the established one
// lifted: nothing is refused while quic-go keeps up.

// Total describes a class's total in force (the opening or the established
// class's).
type Total struct {
	// Adaptive is true when the total follows the receive queue.
	Adaptive bool
	// Cap is the total in packets per second, 0 when lifted.
	Cap uint32
	// Last is what the controller saw in its last period.
	Last backlog.Reading
}

// adaptiveTotals are the controllers of the adaptive totals, by limiter
// class (only the opening and the established classes have one); nil for a
// fixed total.
type adaptiveTotals [sketch.NumClasses]*backlog.Controller

// adaptiveClasses are the classes whose totals may follow the receive
// queue, with the log lines of their changes.
var adaptiveClasses = []struct {
	class          quicclass.Class
	limited, eased string
}{
	{quicclass.Opening, "quic-go falls behind its receive queue: the opening total caps connection-opening packets",
		"quic-go keeps up with its receive queue: the opening total is lifted"},
	{quicclass.Established, "quic-go falls behind its receive queue: the established total caps packets of established connections",
		"quic-go keeps up with its receive queue: the established total is lifted"},
}

// OpeningTotal returns the opening total in force.
func (l *Limiter) OpeningTotal() Total { return l.total(quicclass.Opening) }

// EstablishedTotal returns the established total in force.
func (l *Limiter) EstablishedTotal() Total { return l.total(quicclass.Established) }

// total returns class's total in force.
func (l *Limiter) total(class quicclass.Class) Total {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.put.Config
	if ctl := l.totals[class]; ctl != nil {
		return Total{Adaptive: true, Cap: ctl.Cap(), Last: ctl.Last()}
	}
	return Total{Cap: c.LevelLimit(int(class), c.Limiter.WithDefaults().Levels()-1)}
}

// withTotal returns c with class's total at cap (backlog.Unlimited:
// lifted).
func withTotal(c decide.Config, class quicclass.Class, cap uint32) decide.Config {
	top := c.Limiter.WithDefaults().Levels() - 1
	levels := &c.Limiter.LevelLimits
	if class == quicclass.Established {
		// Its own limits, which it takes from the opening class's
		// when it has none.
		c.Limiter.Established = c.Limiter.Class(int(class))
		levels = &c.Limiter.Established.LevelLimits
	}
	*levels = maps.Clone(*levels)
	if *levels == nil {
		*levels = map[int]uint32{}
	}
	if cap == backlog.Unlimited {
		(*levels)[top] = sketch.Unlimited
	} else {
		(*levels)[top] = cap
	}
	return c
}

// effective is the configuration the engine runs for c: c steered by the
// limiter's controllers (steered), with verification off when the server's
// connection IDs cannot be verified; l.mu must be held.
func (l *Limiter) effective(c decide.Config) decide.Config {
	c.VerifyIDs = c.VerifyIDs && !l.oddIDs.Load()
	c, l.totals = steered(c, l.put.Config, l.totals)
	return c
}

// steered is where the configuration an engine runs is derived from a
// setting's, before the engine is configured with it: c, with each
// adaptive total at its controller's value, and the controllers. A total
// adaptive under prev too (the configuration totals steered) keeps its
// controller; one that becomes adaptive gets a new one, at its start
// (decide.Config.TotalStart); a fixed total has none.
func steered(c, prev decide.Config, totals adaptiveTotals) (decide.Config, adaptiveTotals) {
	for _, a := range adaptiveClasses {
		if !c.Adaptive(a.class) {
			totals[a.class] = nil
			continue
		}
		if totals[a.class] == nil || !prev.Adaptive(a.class) {
			totals[a.class] = backlog.NewController(backlog.LawFor(c.Limiter, int(a.class)), c.TotalStart(a.class))
		}
		c = withTotal(c, a.class, totals[a.class].Cap())
	}
	return c, totals
}

// applied is the configuration in force: the setting's, made effective;
// l.mu must be held.
func (l *Limiter) applied() decide.Config {
	c := l.put.Config
	c.VerifyIDs = c.VerifyIDs && !l.oddIDs.Load()
	for _, a := range adaptiveClasses {
		if ctl := l.totals[a.class]; ctl != nil {
			c = withTotal(c, a.class, ctl.Cap())
		}
	}
	return c
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

// steerTotal runs the control loops of the adaptive totals, and the
// userspace mode's shed of long headers (shed). A total logs a warning
// when the queue makes it fall from lifted, and a line when it is lifted
// again after one: not the opening total's start at its level limit,
// before any sign of load.
func (l *Limiter) steerTotal() {
	defer l.done.Done()
	tk := time.NewTicker(backlog.Period)
	defer tk.Stop()
	base := time.Now()
	var shedding stateLog
	var totals [sketch.NumClasses]stateLog
	for {
		select {
		case <-l.stop:
			return
		case <-tk.C:
		}
		s, st, err := l.sample(int64(time.Since(base)))
		if err != nil {
			continue // no queue to read (not Linux, or no socket yet): the totals stay where they are
		}
		l.shed(s, st, &shedding)
		for _, a := range adaptiveClasses {
			l.steer(a.class, s, st, &totals[a.class], a.limited, a.eased)
		}
	}
}

// steer steps class's controller, if its total is adaptive, on sample s
// (st are the engine's counters in it), and logs a change of state.
func (l *Limiter) steer(class quicclass.Class, s backlog.Sample, st decide.Stats, log *stateLog, limited, eased string) {
	s.Passed = 0
	for fam := range decide.Families {
		s.Passed += st.Passed[class][fam]
	}
	l.mu.Lock()
	ctl := l.totals[class]
	if ctl == nil {
		l.mu.Unlock()
		return
	}
	was := ctl.Cap()
	cap, changed := ctl.Step(s)
	if changed {
		if err := l.eng.Configure(l.applied()); err != nil {
			l.put.Logger.Error("moving the total", zap.String("limiter", l.name), zap.String("class", class.String()),
				zap.Error(err))
		}
	}
	logger, last := l.put.Logger, ctl.Last()
	l.mu.Unlock()
	// The total is limited by the load once the queue made it fall (from
	// lifted, or from higher), until it is lifted again: a total that
	// starts limited and rises is not.
	fell := was == backlog.Unlimited || cap < was
	on := cap != backlog.Unlimited && (fell || log.was)
	if !log.changed(on, time.Now()) {
		return
	}
	fields := []zap.Field{zap.String("limiter", l.name), zap.Float64("receive_queue_fill", last.Fill),
		zap.Uint64("receive_queue_drops", last.Overflows), zap.Float64(class.String()+"_pps", last.PassedPPS)}
	if on {
		logger.Warn(limited, append(fields, zap.Uint32(class.String()+"_total_pps", cap))...)
	} else {
		logger.Info(eased, fields...)
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
