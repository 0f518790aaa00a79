package userspace

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// eventQueue is how many reports of new streams wait for the reader; more
// are lost, as when the kernel's ring buffer is full.
const eventQueue = 512

// Decider is a decide.Filter that is safe for concurrent use, with its own
// monotonic clock and random numbers, and tracks the streams it drops
// packets of the way the kernel filter does. Its methods mirror kernel.Program's,
// so that one interface can drive either.
type Decider struct {
	mu    sync.Mutex
	f     *decide.Filter
	cfg   decide.Config
	rng   uint64
	clock clock
	shift uint8
	mask  uint32
	tab   streamTable
	// fair holds the networks the fair total drops packets of (see
	// trackFair), for the kernel pre-filter; no events are reported.
	fair streamTable
	// trackPacing paces new tracked streams from trackTAT; untracked
	// counts the sampled drops it refused.
	trackPacing decide.Pacing
	trackTAT    uint64
	untracked   uint64
	events      chan decide.Stream
	// tracked receives, without blocking, when a stream or a network
	// starts being tracked (Tracked).
	tracked chan struct{}
	// returning are the sources of returning users, with when each was
	// last seen (noteReturning).
	returning map[returningKey]int64
	// reader is the open event reader, if any.
	reader *EventReader
	closed chan struct{}
	once   sync.Once
}

// clock is the limiter's monotonic time: nanoseconds since base (read
// through base's monotonic clock), or a test's.
type clock struct {
	base time.Time
	test func() int64
}

func (c *clock) now() int64 {
	if c.test != nil {
		return c.test()
	}
	return int64(time.Since(c.base))
}

// wall converts a reading of the clock to wall time.
func (c *clock) wall(ns int64) time.Time { return c.base.Add(time.Duration(ns)) }

// options are switches for tests; the zero value is production.
type options struct {
	hashKey    *sketch.HashKey
	trackShift *uint8
	now        func() int64
	seed       uint64
}

// New returns a limiter for c with hash key hk, nil for a fresh random one
// (a limiter that takes over what another engine learned, AdoptLearned,
// must hash with that engine's key). It refuses exactly the configurations
// the kernel filter refuses.
func New(c decide.Config, hk *sketch.HashKey) (*Decider, error) {
	return newDecider(c, options{hashKey: hk})
}

// HashKey returns the limiter's hash key.
func (l *Decider) HashKey() sketch.HashKey { return l.f.HashKey() }

func newDecider(c decide.Config, o options) (*Decider, error) {
	c = c.Clone()
	var hk sketch.HashKey
	var err error
	if o.hashKey != nil {
		hk = *o.hashKey
	} else if hk, err = sketch.NewHashKey(nil); err != nil {
		return nil, err
	}
	f, err := decide.New(c, hk)
	if err != nil {
		return nil, err
	}
	l := &Decider{
		f:           f,
		cfg:         c,
		rng:         o.seed,
		clock:       clock{base: time.Now(), test: o.now},
		shift:       decide.DefaultTrackShift,
		tab:         newStreamTable(decide.MaxTrackedStreams),
		fair:        newStreamTable(MaxFairNetworks),
		trackPacing: decide.TrackPacing(),
		events:      make(chan decide.Stream, eventQueue),
		tracked:     make(chan struct{}, 1),
		returning:   map[returningKey]int64{},
		closed:      make(chan struct{}),
	}
	if o.trackShift != nil {
		l.shift = *o.trackShift
	}
	l.mask = 1<<l.shift - 1
	for l.rng == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("seeding the limiter's random numbers: %w", err)
		}
		l.rng = binary.LittleEndian.Uint64(b[:])
	}
	return l, nil
}

// Configure replaces the configuration, all or nothing: on an error the
// limiter is left as it was. The sketches, counters and tracked streams are
// kept. The lattice (prefix count and PerDstPort) cannot change.
func (l *Decider) Configure(c decide.Config) error {
	c = c.Clone()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.f.Update(c); err != nil {
		return fmt.Errorf("configuring the userspace limiter: %w", err)
	}
	l.cfg = c
	return nil
}

// Config returns the configuration in force.
func (l *Decider) Config() decide.Config {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.Clone()
}

// Params returns the compiled configuration in force.
func (l *Decider) Params() *sketch.Params {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Limiter().Params()
}

// Stats returns the datagram counters. The error is always nil; it is there
// to match kernel.Program.
func (l *Decider) Stats() (decide.Stats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Stats(), nil
}

// Sweep resets the sketch cells idle for so long that their 32-bit epoch
// could wrap (sketch.Limiter.Sweep); the owner runs it at least daily. It
// returns how many cells it reset; the error is always nil.
func (l *Decider) Sweep() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Limiter().Sweep(l.clock.now()), nil
}

// LearnServerID binds id, a connection ID the server put in a long
// header's source connection ID, to to, the address it was sent to, now:
// with VerifyIDs, datagrams from to carrying it are verified from now on.
// It refuses an invalid address.
func (l *Decider) LearnServerID(id decide.ServerID, to netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.LearnServerID(id, to, l.clock.now())
}

// LearnPeer records that the server sent a connection's packet to addr,
// now (decide.Learned.LearnPeer). It refuses an invalid address.
func (l *Decider) LearnPeer(addr netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.LearnPeer(addr, l.clock.now())
}

// Grant adds credits to addr, an answered peer (decide.Learned.Grant). It
// takes no lock: the credits are written with atomic operations, as the
// datagrams that spend them are.
func (l *Decider) Grant(addr netip.Addr, credits int) error {
	return l.f.Grant(addr, credits)
}

// ExpireLearned forgets the keys of each learned set neither learned nor
// used for lifetime, and returns how many of each. The error is always
// nil; it is there to match the kernel engine.
func (l *Decider) ExpireLearned(lifetime time.Duration) ([decide.NumLearned]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.ExpireLearned(l.clock.now(), lifetime.Nanoseconds()), nil
}

// Learned returns the limiter's learned sets.
func (l *Decider) Learned() decide.Learned { return l.f.Learned() }

// AdoptLearned takes over the keys of another engine's learned sets, each
// stamped now (the other engine's clock is not this one's).
func (l *Decider) AdoptLearned(from decide.Learned) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.f.Learned().CopyFrom(from, decide.Stamp(l.clock.now()))
}

// Decide decides the fate of one datagram now, counts it and tracks its
// stream if it is dropped.
func (l *Decider) Decide(d *decide.Datagram) decide.Outcome {
	l.mu.Lock()
	out := l.decide(d, l.clock.now())
	l.mu.Unlock()
	return out
}

// DecideBatch decides every datagram of ds with one acquisition of the lock
// and one reading of the clock, and sets drop[i] for those to drop (never
// in a dry run). drop must be at least as long as ds.
func (l *Decider) DecideBatch(ds []decide.Datagram, drop []bool) {
	drop = drop[:len(ds)]
	l.mu.Lock()
	now := l.clock.now()
	for i := range ds {
		drop[i] = l.decide(&ds[i], now).Drop
	}
	l.mu.Unlock()
}

// decide is Decide with the lock held, as the kernel's entry point does it:
// one random number per datagram dithers the limiter (its top bits) and
// samples drops (its low bits): a drop of the limiter's classes (applied or
// not) and an invalid datagram are tracked when it has none of the sampling
// bits set.
func (l *Decider) decide(d *decide.Datagram, now int64) decide.Outcome {
	rnd := l.random()
	out := l.f.Decide(d, now, rnd)
	l.noteReturning(&d.Key, &out, now, rnd)
	if rnd&l.mask != 0 {
		return out
	}
	switch {
	case out.Allowlisted || out.Class == quicclass.Negotiation:
	case out.Class == quicclass.Invalid:
		l.trackInvalid(&d.Key, out.Reason, now)
	case out.Verdict.Drop:
		l.track(&d.Key, &out, now)
		l.trackFair(&d.Key, &out, now)
	}
	return out
}

// random is xorshift64* (Vigna), the kernel filter's generator: it only
// dithers thresholds and samples drops, so speed matters more than
// unpredictability.
func (l *Decider) random() uint32 {
	x := l.rng
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	l.rng = x
	return uint32((x * 0x2545F4914F6CDD1D) >> 32)
}

// Close ends the event reader (a blocked Read returns os.ErrClosed) and
// makes Events fail. Datagrams are still decided: a Conn that uses the
// limiter stays protected, as a socket keeps the kernel filter attached
// after kernel.Program.Close.
func (l *Decider) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}
