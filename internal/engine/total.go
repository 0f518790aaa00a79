package engine

import (
	"maps"
	"time"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/backlog"
	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
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
func withTotal(c datagram.Config, cap uint32) datagram.Config {
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
func (l *Limiter) effective(c datagram.Config) datagram.Config {
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
// (limited, lifted) at most every logEvery.
const logEvery = 10 * time.Second

// steerTotal runs the control loop of an adaptive opening total.
func (l *Limiter) steerTotal() {
	defer l.done.Done()
	tk := time.NewTicker(backlog.Period)
	defer tk.Stop()
	base := time.Now()
	var lastLog time.Time
	wasLimited := false
	for {
		select {
		case <-l.stop:
			return
		case <-tk.C:
		}
		s, err := l.sample(int64(time.Since(base)))
		if err != nil {
			continue // no queue to read (not Linux, or no socket yet): the total stays where it is
		}
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
		if limited == wasLimited || time.Since(lastLog) < logEvery {
			continue
		}
		wasLimited, lastLog = limited, time.Now()
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

// sample reads the sockets and the counters for the controller.
func (l *Limiter) sample(at int64) (backlog.Sample, error) {
	queued, capacity, drops, err := backlog.ReadSockets(l.Sockets())
	if err != nil || capacity == 0 {
		return backlog.Sample{}, errNoQueue
	}
	eng := l.Engine()
	st, err := eng.Stats()
	if err != nil {
		return backlog.Sample{}, err
	}
	s := backlog.Sample{At: at, Queued: queued, Capacity: capacity}
	var refused uint64
	for fam := range datagram.Families {
		s.Opened += st.Passed[0][fam]
		for class := range st.Dropped {
			for _, n := range st.Dropped[class][fam] {
				refused += n
			}
		}
		for _, n := range st.Invalid[0][fam] {
			refused += n
		}
		refused += st.Negotiation[fam][1]
	}
	// The kernel counts a socket filter's refusals among the socket's
	// drops; the userspace limiter refuses what was already received, but
	// its classic BPF pre-filter refuses in the kernel (estimated).
	switch pf, ok := eng.(Prefiltered); {
	case eng.Mode() == ModeBPF:
		s.Overflows = max(drops, refused) - refused
	case ok:
		pre := pf.Prefilter().Dropped()
		s.Overflows = max(drops, pre) - pre
	default:
		s.Overflows = drops
	}
	return s, nil
}
