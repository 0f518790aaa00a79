// Package sim runs the limiter of package sketch against synthetic traffic in
// virtual time and reports, second by second, what each stream offered and
// what the limiter forwarded.
package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Stream names used in reports: every scenario has a flood, a legit stream,
// or both, each summed over all of its sources.
const (
	Flood = "flood"
	Legit = "legit"
)

// Arrivals generates the arrival times of one stream's packets.
type Arrivals interface {
	// Next returns the time of the packet after the one at t (nanoseconds),
	// or false when the stream has ended.
	Next(t int64, rng *rand.Rand) (int64, bool)
	// First returns the time of the stream's first packet.
	First(rng *rand.Rand) (int64, bool)
}

// Poisson arrivals at Rate packets per second between From and Until.
type Poisson struct {
	Rate        float64
	From, Until int64
}

// First implements Arrivals.
func (p Poisson) First(rng *rand.Rand) (int64, bool) { return p.Next(p.From, rng) }

// Next implements Arrivals.
func (p Poisson) Next(t int64, rng *rand.Rand) (int64, bool) {
	gap := int64(math.Ceil(rng.ExpFloat64() / p.Rate * 1e9))
	n := t + max(gap, 1)
	return n, n < p.Until
}

// Pulses are Poisson arrivals at Rate packets per second during the first
// On nanoseconds of every Period from From, until Until: a flood that
// starts and stops.
type Pulses struct {
	Rate                    float64
	From, Until, On, Period int64
}

// First implements Arrivals.
func (p Pulses) First(rng *rand.Rand) (int64, bool) { return p.Next(p.From, rng) }

// Next implements Arrivals.
func (p Pulses) Next(t int64, rng *rand.Rand) (int64, bool) {
	gap := int64(math.Ceil(rng.ExpFloat64() / p.Rate * 1e9))
	n := t + max(gap, 1)
	if into := (n - p.From) % p.Period; into >= p.On {
		// The pulse has ended: the next one starts afresh.
		n += p.Period - into
	}
	return n, n < p.Until
}

// Bursts sends Count packets Spacing apart, every Every, starting at From,
// Times times.
type Bursts struct {
	From, Every, Spacing int64
	Count, Times         int
}

// First implements Arrivals.
func (b Bursts) First(*rand.Rand) (int64, bool) { return b.From, b.Times > 0 && b.Count > 0 }

// Next implements Arrivals.
func (b Bursts) Next(t int64, _ *rand.Rand) (int64, bool) {
	i := (t - b.From) / b.Every
	inBurst := (t - b.From - i*b.Every) / b.Spacing
	if int(inBurst)+1 < b.Count {
		return t + b.Spacing, true
	}
	if int(i)+1 < b.Times {
		return b.From + (i+1)*b.Every, true
	}
	return 0, false
}

// Source picks the key of a stream's next packet.
type Source func(rng *rand.Rand, now int64) sketch.Key

// Stream is one kind of traffic in a scenario.
type Stream struct {
	Name     string
	Arrivals Arrivals
	Source   Source
}

// Scenario is a named traffic mix, a limiter configuration and a duration.
type Scenario struct {
	Name        string
	Description string
	Config      sketch.Config
	Seconds     int
	Streams     []Stream
	// Server, when set, puts a model of quic-go behind the limiter, and
	// the socket's total (Config's last level limit, where it starts)
	// follows its receive queue as the engine's does.
	Server *Server
}

// Server models quic-go behind the socket: a receive queue of Queue packets
// served at Rate packets per second. A packet the limiter forwards counts as
// forwarded only if the queue has room; the others are lost (Total.Lost).
type Server struct {
	Rate, Queue float64
}

// Total is the adaptive total during one second of a scenario with a
// Server.
type Total struct {
	Second int
	// Cap is the total at the end of the second, 0 when lifted; Lowest
	// the lowest during it (0: lifted throughout).
	Cap, Lowest uint32
	// Lost counts packets forwarded by the limiter that found the queue
	// full.
	Lost int
}

// Row is one line of a report: one stream during one second.
type Row struct {
	Second    int
	Stream    string
	Offered   int
	Forwarded int
}

// Result is a scenario's report.
type Result struct {
	Scenario *Scenario
	Rows     []Row
	// MemoryBytes is the limiter's sketch memory.
	MemoryBytes int
	// Totals are the adaptive total, second by second, for a scenario
	// with a Server.
	Totals []Total
}

// Series returns a stream's rows in second order.
func (r *Result) Series(stream string) []Row {
	var out []Row
	for _, row := range r.Rows {
		if row.Stream == stream {
			out = append(out, row)
		}
	}
	return out
}

type pending struct {
	at     int64
	stream int
}

type queue []pending

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].stream < q[j].stream)
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(pending)) }
func (q *queue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// Run plays scenario s with the given seed. The seed fixes the hash key, the
// arrivals, the sources and the random draws, so a run is reproducible.
func Run(s *Scenario, seed uint64) (*Result, error) {
	keyRNG := rand.New(rand.NewPCG(seed, 0x6861736b6579))
	hk, err := sketch.NewHashKey(readerFunc(func(p []byte) (int, error) {
		for i := range p {
			p[i] = byte(keyRNG.Uint32())
		}
		return len(p), nil
	}))
	if err != nil {
		return nil, err
	}
	lim, err := sketch.New(s.Config, hk)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	decide := rand.New(rand.NewPCG(seed, 0x646563696465))
	rngs := make([]*rand.Rand, len(s.Streams))
	q := &queue{}
	for i, st := range s.Streams {
		rngs[i] = rand.New(rand.NewPCG(seed, uint64(i+1)))
		if t, ok := st.Arrivals.First(rngs[i]); ok {
			heap.Push(q, pending{t, i})
		}
	}
	type tally struct{ offered, forwarded []int }
	tallies := map[string]*tally{}
	for _, st := range s.Streams {
		if tallies[st.Name] == nil {
			tallies[st.Name] = &tally{make([]int, s.Seconds), make([]int, s.Seconds)}
		}
	}
	end := int64(s.Seconds) * 1e9
	srv, err := newServerModel(s, lim)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	for q.Len() > 0 {
		ev := heap.Pop(q).(pending)
		if ev.at >= end {
			continue
		}
		if err := srv.advance(ev.at); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		st := &s.Streams[ev.stream]
		rng := rngs[ev.stream]
		k := st.Source(rng, ev.at)
		// Offset time so that the limiter never sees t=0, as a real clock.
		// Every stream is of class 0: the classes have lattices of their
		// own, so a scenario of one class shows what each does.
		v := lim.Decide(&k, 0, ev.at+bootOffset, decide.Uint32())
		sec := int(ev.at / 1e9)
		tl := tallies[st.Name]
		tl.offered[sec]++
		if !v.Drop && srv.admit(sec) {
			tl.forwarded[sec]++
		}
		if t, ok := st.Arrivals.Next(ev.at, rng); ok {
			heap.Push(q, pending{t, ev.stream})
		}
	}
	res := &Result{Scenario: s, MemoryBytes: lim.MemoryBytes(), Totals: srv.result()}
	for sec := range s.Seconds {
		for _, name := range []string{Flood, Legit} {
			if tl := tallies[name]; tl != nil {
				res.Rows = append(res.Rows, Row{sec, name, tl.offered[sec], tl.forwarded[sec]})
			}
		}
	}
	return res, nil
}

// bootOffset is added to virtual time: monotonic clocks do not start at 0.
const bootOffset = int64(3600e9)

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
