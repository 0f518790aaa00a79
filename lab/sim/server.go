package sim

import (
	"maps"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/backlog"
)

// serverModel runs a scenario's Server: the receive queue, and the
// controller that moves the total with it every backlog.Period, as the
// engine does on real sockets. A nil *serverModel admits everything.
type serverModel struct {
	srv    Server
	lim    *sketch.Limiter
	config sketch.Config
	top    int
	ctl    *backlog.Controller
	// queue is the queue's length in packets at time at.
	queue     float64
	at        int64
	next      int64
	sample    backlog.Sample
	totals    []Total
	seconds   int
	overflows uint64
	opened    uint64
}

func newServerModel(s *Scenario, lim *sketch.Limiter) (*serverModel, error) {
	if s.Server == nil {
		return nil, nil
	}
	c := s.Config.WithDefaults()
	top := c.Levels() - 1
	start, ok := c.LevelLimits[top]
	if !ok {
		start = c.Limit
	}
	m := &serverModel{srv: *s.Server, lim: lim, config: c, top: top, ctl: backlog.NewController(backlog.LawFor(c, int(quicclass.Opening)), start),
		next: backlog.Period, seconds: s.Seconds}
	m.totals = make([]Total, s.Seconds)
	for i := range m.totals {
		m.totals[i] = Total{Second: i}
	}
	return m, nil
}

// advance serves the queue up to time t and runs the controller at every
// period boundary on the way.
func (m *serverModel) advance(t int64) error {
	if m == nil {
		return nil
	}
	for m.next <= t {
		m.serve(m.next)
		m.sample = backlog.Sample{At: m.next, Queued: uint64(m.queue), Capacity: uint64(m.srv.Queue),
			Overflows: m.overflows, Passed: m.opened}
		if cap, changed := m.ctl.Step(m.sample); changed {
			c := m.config
			c.LevelLimits = maps.Clone(c.LevelLimits)
			if c.LevelLimits == nil {
				c.LevelLimits = map[int]uint32{}
			}
			c.LevelLimits[m.top] = cap
			if cap == backlog.Unlimited {
				c.LevelLimits[m.top] = sketch.Unlimited
			}
			if err := m.lim.Update(c); err != nil {
				return err
			}
		}
		if sec := int(m.next / 1e9); sec < m.seconds {
			tot := &m.totals[sec]
			tot.Cap = m.ctl.Cap()
			if tot.Cap != backlog.Unlimited && (tot.Lowest == backlog.Unlimited || tot.Cap < tot.Lowest) {
				tot.Lowest = tot.Cap
			}
		}
		m.next += backlog.Period
	}
	m.serve(t)
	return nil
}

// serve drains the queue at the server's rate up to time t.
func (m *serverModel) serve(t int64) {
	m.queue = max(0, m.queue-m.srv.Rate*float64(t-m.at)/1e9)
	m.at = t
}

// admit queues a forwarded packet, or loses it when the queue is full.
func (m *serverModel) admit(sec int) bool {
	if m == nil {
		return true
	}
	if m.queue+1 > m.srv.Queue {
		m.overflows++
		m.totals[sec].Lost++
		return false
	}
	m.queue++
	m.opened++
	return true
}

// result is the totals of the run, none without a server.
func (m *serverModel) result() []Total {
	if m == nil {
		return nil
	}
	return m.totals
}
