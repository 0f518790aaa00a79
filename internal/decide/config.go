package decide

// This file owns the decision's settings: each field of Config with its
// range (Validate and the Check functions), the defaults of what an
// operator leaves out, and the policy of the sockets' totals. The Caddy
// module (the root package) converts its options into a Config and checks
// each with the functions here; the views read a Config through
// report.ConfigOf (internal/engine/report).

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Config is the whole decision's configuration.
type Config struct {
	// Limiter configures the limiter: the opening class limits
	// connection-opening packets (or every datagram when Classify is off),
	// the established class packets of established connections, the
	// unverified class unverified short headers (only with VerifyIDs).
	Limiter sketch.Config
	// Classify sorts datagrams into QUIC classes. Off, every datagram is
	// counted alike, in the opening class: nothing is invalid.
	Classify bool
	// VerifyIDs, when classifying, verifies datagrams against the
	// connection IDs the server issued and the addresses it sends to
	// (LearnServerID, LearnPeer; see package quicclass): short headers
	// with neither go to the unverified class (quicclass.Unverified),
	// Initials and Handshakes that answer a server ID to the established
	// class (quicclass.Established), Handshakes with another ID are
	// invalid, and long headers' lengths are checked. Off, the classes are
	// exactly those without verification, and nothing learned is looked
	// up: keep it off until something learns.
	VerifyIDs bool
	// BlockedPorts are source ports whose datagrams are invalid (nil:
	// none). Used only when classifying.
	BlockedPorts *quicclass.Ports
	// Negotiation is how many datagrams with an unknown QUIC version (and
	// so a Version Negotiation reply) pass per second, for the whole
	// socket, with a burst of as many; 0 drops them all.
	Negotiation uint32
	// DryRun delivers every datagram: drops are counted, not applied.
	DryRun bool
	// Allow exempts source prefixes from the limiter (datagrams of its
	// classes are only counted, as Stats.Allowed), not from validity:
	// their invalid datagrams (blocked source ports among them) are
	// dropped and their unknown versions paced, as anyone's, since a
	// spoofer can send from an allowlisted address.
	Allow []netip.Prefix
	// AdaptiveTotal lets the engine move the opening class's total (its
	// last level limit, which the configuration gives as the starting
	// value) with the socket's receive queue (package backlog), and
	// AdaptiveEstablished the established class's (lifted at the start,
	// whatever its level limit). The decision itself only sees the level
	// limits in force.
	AdaptiveTotal, AdaptiveEstablished bool
}

// Clone returns c with copies of what it refers to, so that the caller may
// change one without the other (a limiter keeps a clone of the
// configuration it decides with). A field of reference type is copied here.
func (c Config) Clone() Config {
	c.Limiter = c.Limiter.Clone()
	c.Allow = slices.Clone(c.Allow)
	if c.BlockedPorts != nil {
		p := *c.BlockedPorts
		c.BlockedPorts = &p
	}
	return c
}

// MaxNegotiation bounds Config.Negotiation: a Version Negotiation reply
// is for the rare client with a version quic-go lacks.
const MaxNegotiation = 1_000_000

// Validate reports the first thing wrong with c: it is the whole
// validation of a decision configuration, the kernel filter's and the
// userspace limiter's alike. Its errors name values as the filter knows
// them ("version negotiation", "window"); a caller that reads them from
// fields of its own checks each as it reads it (CheckNegotiation,
// CheckAllowCapacity and package sketch's checks) and names it as written.
func (c *Config) Validate() error {
	if err := c.validateOwn(); err != nil {
		return err
	}
	return c.Limiter.WithDefaults().Validate()
}

// validateOwn checks what Validate checks besides the limiter's
// configuration, which sketch.Compile checks as it compiles it.
func (c *Config) validateOwn() error {
	if err := CheckNegotiation(c.Negotiation); err != nil {
		return fmt.Errorf("version negotiation %d %w", c.Negotiation, err)
	}
	if err := CheckAllowCapacity(c.Allow); err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	return nil
}

// Compile validates c, as Validate does, and compiles its limiter's
// configuration: each value is checked once on the way.
func (c *Config) Compile() (*sketch.Params, error) {
	if err := c.validateOwn(); err != nil {
		return nil, err
	}
	return sketch.Compile(c.Limiter)
}

// CheckNegotiation reports why n datagrams per second is not a Version
// Negotiation cap the filter takes, or nil.
func CheckNegotiation(n uint32) error {
	if n > MaxNegotiation {
		return fmt.Errorf("out of range [0, %d] datagrams per second", MaxNegotiation)
	}
	return nil
}

// The defaults of what an operator leaves out, and the policy of the
// sockets' totals, decided here once: the Caddy module (the root package)
// fills its options from them and applies WithTotals, the engine starts
// an adaptive total where TotalStart says, and the tests' typical
// configurations (internal/testutil) are built from them. The limiter
// fills two defaults of its own, where they are used: the prefixes
// (sketch.DefaultIPv4Prefixes and DefaultIPv6Prefixes, through
// sketch.Config.WithDefaults) and the unverified class's limits
// (sketch.DefaultUnverifiedLimit and DefaultUnverifiedTotal, through
// sketch.Config.Class).
const (
	// DefaultLimit is the limit, in packets per second, of every stream
	// of the opening class at every level.
	DefaultLimit = 1000
	// DefaultWindow is the smoothing window.
	DefaultWindow = time.Second
	// DefaultOpeningTotal is where the cap on the connection-opening
	// packets of the whole socket (the last level of the opening class)
	// starts when classifying, shared fairly among networks; from there it
	// follows quic-go's receive queue (package backlog): lifted while
	// quic-go keeps up, lowered when it falls behind. Of the fixed caps
	// measured on a 2-core machine (README, "Choosing numbers"), it served
	// a quiet network's new connections as well as any higher one. A limit
	// above it raises it to the limit; a window too long for it lowers it
	// to the largest burst the counters hold.
	DefaultOpeningTotal = 20_000
	// DefaultEstablishedLimit is the limit of established-connection
	// packets at every level but the last, which is unlimited: 200,000
	// packets per second is about 2.4 Gbit/s of 1,500-byte datagrams, so
	// that one client's gigabit transfer in either direction passes
	// untouched.
	DefaultEstablishedLimit = 200_000
	// DefaultVersionNegotiation is how many datagrams with a QUIC version
	// quic-go lacks pass per second, for the whole socket.
	DefaultVersionNegotiation = 10
)

// WithTotals returns c with the totals' policy applied to the totals (the
// last level of the opening and of the established class) its level
// limits leave unset; c.Limiter.Established must have a limit of its own.
// When classifying, an unset opening total is adaptive: it starts at
// DefaultOpeningTotal, lowered to the largest burst the counters hold
// with c's window and raised to c's limit, and follows the receive queue
// (AdaptiveTotal). An unset established total is lifted, and when
// classifying adaptive too (AdaptiveEstablished): nothing the filter lets
// through is unbounded, and nothing is refused while quic-go keeps up. A
// total that is set, to a limit or lifted, stays where it is set.
func WithTotals(c Config) Config {
	top := c.Limiter.WithDefaults().Levels() - 1
	opening, established := &c.Limiter.LevelLimits, &c.Limiter.Established.LevelLimits
	for _, m := range []*map[int]uint32{opening, established} {
		if *m = maps.Clone(*m); *m == nil {
			*m = map[int]uint32{}
		}
	}
	if _, set := (*opening)[top]; !set && c.Classify {
		burst := uint32(min(float64(sketch.MaxBurst)/c.Limiter.Window.Seconds(), sketch.MaxLimit))
		(*opening)[top] = max(min(DefaultOpeningTotal, burst), c.Limiter.Limit)
		c.AdaptiveTotal = true
	}
	if _, set := (*established)[top]; !set {
		(*established)[top] = sketch.Unlimited
		c.AdaptiveEstablished = c.Classify
	}
	return c
}

// Adaptive reports whether c makes class's total follow the receive queue:
// the opening or the established class's, as AdaptiveTotal and
// AdaptiveEstablished say.
func (c *Config) Adaptive(class quicclass.Class) bool {
	switch class {
	case quicclass.Opening:
		return c.AdaptiveTotal
	case quicclass.Established:
		return c.AdaptiveEstablished
	}
	return false
}

// TotalStart returns where class's adaptive total starts, in packets per
// second, 0 when lifted: the opening total at its level limit, the
// established total lifted, so that nothing is refused before the
// receive queue says quic-go falls behind.
func (c *Config) TotalStart(class quicclass.Class) uint32 {
	if class != quicclass.Opening {
		return 0
	}
	lims := c.Limiter.Class(int(class))
	start := lims.Limit
	if l, ok := lims.LevelLimits[c.Limiter.WithDefaults().Levels()-1]; ok {
		start = l
	}
	if start == sketch.Unlimited {
		return 0
	}
	return start
}

// LevelLimit is the limit in packets per second of a level of a class
// under c, or 0 when the level is unlimited.
func (c *Config) LevelLimit(class, level int) uint32 {
	lims := c.Limiter.Class(class)
	lim := lims.Limit
	if l, ok := lims.LevelLimits[level]; ok {
		lim = l
	}
	if lim == sketch.Unlimited {
		return 0
	}
	return lim
}
