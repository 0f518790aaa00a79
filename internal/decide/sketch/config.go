package sketch

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// Time constants. Time is quantised twice: into epochs of 2^EpochShift ns
// (about 1.05 ms), the unit in which a cell remembers when it was last
// touched, and into slots of 2^SlotShift ns (about 4.1 µs), the resolution
// of a packet's weight inside an epoch.
const (
	EpochShift = 20 // C: EPOCH_SHIFT
	SlotShift  = 12 // C: SLOT_SHIFT
	// Slots is the number of weight slots in one epoch.
	Slots = 1 << (EpochShift - SlotShift) // C: SLOTS

	// decayBits is the width of each of the three decay tables' index: a cell
	// idle for k epochs is scaled by D0[k&511]*D1[(k>>9)&511]*D2[k>>18].
	decayBits = 9 // C: DECAY_BITS
	// DecayEntries is the length of each decay table.
	DecayEntries = 1 << decayBits // C: DECAY_ENTRIES
	// decayHorizon is the first idle time, in epochs, that the tables do not
	// cover (2^27 epochs, about 39 h); such a cell is zeroed.
	decayHorizon = 1 << (3 * decayBits) // C: DECAY_HORIZON

	// A cell keeps its epoch in 32 bits, which wrap after 2^32 epochs
	// (about 52 days). A clock reading up to SkewEpochs epochs older than
	// the cell's (another CPU's clock, or a packet that read the clock
	// before another CPU moved the cell on) is taken as the cell's own
	// epoch: no decay, no change of epoch. A reading further behind is
	// taken as a cell idle so long that its epoch wrapped: it is forgotten.
	// Sweep keeps cells from ever idling that long.
	SkewEpochs = 1 << 10 // C: SKEW_EPOCHS

	// PeriodShift sets how long a source keeps its rank at the fair total:
	// sources are ranked anew every 2^PeriodShift ns (about 4.3 s).
	PeriodShift = 32 // C: PERIOD_SHIFT
)

// Bounds on the configuration, enforced by Validate.
const (
	// MaxPrefixes is the largest number of source prefixes per family.
	MaxPrefixes = 4 // C: MAX_PREFIXES
	// MaxNodes is the largest number of lattice nodes: every prefix, source
	// port specified or wildcard, destination port specified or wildcard.
	MaxNodes = MaxPrefixes * 4 // C: MAX_NODES
	// MaxLevels is the largest number of lattice levels.
	MaxLevels = MaxPrefixes + 2 // C: MAX_LEVELS
	// MinWindow and MaxWindow bound the smoothing window.
	MinWindow = 10 * time.Millisecond
	MaxWindow = time.Hour
	// MaxLimit is the largest limit in packets per second: more than one
	// socket can receive.
	MaxLimit = 10_000_000
	// MaxBurst bounds limit x window, in packets: the counters are 32-bit
	// with FracBits fractional bits, and a count must reach well past
	// the threshold (its noise margin, the weight of a late slot, the
	// reported rate of a flood) without saturating.
	MaxBurst = 1 << 23
	// Unlimited, as a level limit, lifts the limit of that level.
	Unlimited = ^uint32(0)

	// NumClasses is the number of traffic classes with a lattice of their
	// own, indexed by quicclass.Class: the opening class
	// (quicclass.Opening) counts connection-opening packets (or every
	// datagram when the filter does not classify), the established class
	// (quicclass.Established) established-connection packets (with
	// connection ID verification, those verified by a server ID or a peer
	// address), the unverified class (quicclass.Unverified) short-header
	// packets that could not be verified.
	NumClasses = 3 // C: NUM_CLASSES
)

// The limits of the unverified class (unverified short headers and
// Handshakes) when Config.Unverified leaves them zero. A legitimate client
// is unverified only for moments: when it moves to an address the server
// has not sent to yet (a NAT rebinding, a migration), until the server
// moves there and its datagrams grant the address credit, when a burst
// outruns its address's credit, or after the learned state is lost.
// DefaultUnverifiedLimit per stream (a burst of as many at a 1 s window)
// carries such a client's ACKs and requests through that moment. What else
// arrives there is junk, from any number of (spoofed) sources:
// DefaultUnverifiedTotal holds all of it to a rate whose cost to quic-go is
// negligible, shared fairly among networks by the fair total. Under a flood
// from a new random address on every packet the share cannot pick out a
// quiet network (every network's estimate is the cell's average), and a
// client there keeps little of what it sends to this class: its verified
// packets (by ID, proof or credit) never come here. The cost is less
// quic-go's (a connection ID lookup and a drop) than the server's wakeups:
// at 2,000 a second, spread over a flood, one wakeup of the reading
// goroutine each cost a few percent of a core (the end-to-end benchmark's
// spoofed-short and short-1024). A flood from a few sources in each of many
// networks gets about twice the total through, from a new address on every
// packet about three times (the proportional floor adds to what the share
// admits).
const (
	DefaultUnverifiedLimit = 1_000
	DefaultUnverifiedTotal = 500
)

// Default prefixes, most specific first.
var (
	DefaultIPv4Prefixes = []uint8{32, 24, 0}
	DefaultIPv6Prefixes = []uint8{64, 48, 0}
)

// Config is what an operator chooses. The zero value is not valid: Limit and
// Window are required; WithDefaults fills the prefixes.
type Config struct {
	// Limit is the rate, in packets per second, that every lattice node
	// of the opening class may forward unless LevelLimits says otherwise.
	Limit uint32
	// Window is the smoothing period of the rate estimate. A stream that
	// has been quiet for a few windows may send a burst of Limit*Window
	// packets back to back.
	Window time.Duration
	// LevelLimits overrides Limit for whole levels of the lattice (see
	// Params.Levels for the numbering). Unlimited lifts a level's limit;
	// lifting the top level removes the cap on the socket's total.
	LevelLimits map[int]uint32
	// Established are the limits of the established class. Left zero, it
	// has the limits of the opening class.
	Established Limits
	// Unverified are the limits of the unverified class. Left zero
	// (Limit 0), it has DefaultUnverifiedLimit at every level but the top,
	// the socket's total, which has DefaultUnverifiedTotal.
	Unverified Limits
	// ProportionalTotal turns the fair total off: the socket's total then
	// drops the same share of everyone's packets, as every other node
	// does. For comparisons (rakesim's quiet-network-proportional).
	ProportionalTotal bool
	// IPv4Prefixes and IPv6Prefixes are the source prefix lengths, most
	// specific first, strictly decreasing and ending with 0. Both lists
	// must have the same length: level i is prefix i of either family.
	IPv4Prefixes []uint8
	IPv6Prefixes []uint8
	// PerDstPort keeps the destination port as a lattice dimension, for a
	// limiter shared by sockets on several ports. A limiter that serves one
	// socket leaves it off: every packet has the same destination port, so
	// the dimension would only double the work.
	PerDstPort bool
	// OnValidate, when set, is called by each Validate: a test counts
	// with it how often one configuration is checked on its way from the
	// operator to the filter. It is not a setting (the JSON, and so
	// engine.Equal, leave it out).
	OnValidate func() `json:"-"`
}

// Limits are one class's limits, in packets per second: Limit for every
// level, LevelLimits for whole levels (Unlimited lifts a level's limit).
type Limits struct {
	Limit       uint32
	LevelLimits map[int]uint32
}

// Class returns the limits of a limiter class: quicclass.Opening,
// Established or Unverified.
func (c Config) Class(class int) Limits {
	switch {
	case class == int(quicclass.Established) && c.Established.Limit != 0:
		return c.Established
	case class == int(quicclass.Unverified) && c.Unverified.Limit != 0:
		return c.Unverified
	case class == int(quicclass.Unverified):
		top := c.WithDefaults().Levels() - 1
		return Limits{Limit: DefaultUnverifiedLimit, LevelLimits: map[int]uint32{top: DefaultUnverifiedTotal}}
	}
	return Limits{Limit: c.Limit, LevelLimits: c.LevelLimits}
}

// className prefixes the names of the established and the unverified
// classes' values in errors.
var className = [NumClasses]string{quicclass.Established: "established ", quicclass.Unverified: "unverified "}

// WithDefaults returns c with empty prefix lists replaced by the defaults.
func (c Config) WithDefaults() Config {
	if len(c.IPv4Prefixes) == 0 {
		c.IPv4Prefixes = slices.Clone(DefaultIPv4Prefixes)
	}
	if len(c.IPv6Prefixes) == 0 {
		c.IPv6Prefixes = slices.Clone(DefaultIPv6Prefixes)
	}
	return c
}

// Clone returns c with copies of what it refers to (its level limits and
// prefixes), so that the caller may change one without the other.
func (c Config) Clone() Config {
	c.LevelLimits = maps.Clone(c.LevelLimits)
	c.Established.LevelLimits = maps.Clone(c.Established.LevelLimits)
	c.Unverified.LevelLimits = maps.Clone(c.Unverified.LevelLimits)
	c.IPv4Prefixes = slices.Clone(c.IPv4Prefixes)
	c.IPv6Prefixes = slices.Clone(c.IPv6Prefixes)
	return c
}

// Levels returns the number of lattice levels the configuration yields.
func (c Config) Levels() int {
	n := len(c.IPv4Prefixes) + 1
	if c.PerDstPort {
		n++
	}
	return n
}

// Validate reports the first thing wrong with c, naming the value as the
// limiter knows it ("window", "established level 2 limit", "IPv4 prefixes");
// a caller that reads the values from fields of its own checks them with
// CheckWindow, CheckLimit and CheckPrefixes as it reads them, and names them
// as its user wrote them.
func (c Config) Validate() error {
	if c.OnValidate != nil {
		c.OnValidate()
	}
	if err := CheckWindow(c.Window); err != nil {
		return fmt.Errorf("window %v %w", c.Window, err)
	}
	for class := range NumClasses {
		if err := c.validateClass(class); err != nil {
			return err
		}
	}
	if err := CheckPrefixes(c.IPv4Prefixes, 32); err != nil {
		return fmt.Errorf("IPv4 prefixes %v: %w", c.IPv4Prefixes, err)
	}
	if err := CheckPrefixes(c.IPv6Prefixes, 128); err != nil {
		return fmt.Errorf("IPv6 prefixes %v: %w", c.IPv6Prefixes, err)
	}
	if len(c.IPv4Prefixes) != len(c.IPv6Prefixes) {
		return fmt.Errorf("IPv4 prefixes %v and IPv6 prefixes %v %w", c.IPv4Prefixes, c.IPv6Prefixes, ErrPrefixLengths)
	}
	return nil
}

// validateClass checks the limits of one class.
func (c Config) validateClass(class int) error {
	lim := c.Class(class)
	prefix := className[class]
	if err := CheckLimit(lim.Limit, c.Window); err != nil {
		return fmt.Errorf("%slimit %d %w", prefix, lim.Limit, err)
	}
	levels := c.WithDefaults().Levels()
	for lvl, l := range lim.LevelLimits {
		if err := CheckLevel(lvl, levels); err != nil {
			return fmt.Errorf("%slevel limits: %w", prefix, err)
		}
		if l == Unlimited {
			continue
		}
		if err := CheckLimit(l, c.Window); err != nil {
			return fmt.Errorf("%slevel %d limit %d %w", prefix, lvl, l, err)
		}
	}
	return nil
}

// ErrPrefixLengths follows the two prefix lists when their lengths differ.
var ErrPrefixLengths = errors.New("must have the same length: level i is prefix i of either family")

// CheckWindow reports why w is not a window the limiter supports, or nil.
// The error reads after the window: "window 2h0m0s out of range [...]".
func CheckWindow(w time.Duration) error {
	if w < MinWindow || w > MaxWindow {
		return fmt.Errorf("out of range [%v, %v]", MinWindow, MaxWindow)
	}
	return nil
}

// CheckLimit reports why lim, in packets per second, is not a limit the
// limiter holds with window (0: not known yet), or nil. The error reads
// after the limit: "limit 50 with window 10ms allows a burst of ...".
func CheckLimit(lim uint32, window time.Duration) error {
	if lim == 0 || lim > MaxLimit {
		return fmt.Errorf("out of range [1, %d] packets per second", MaxLimit)
	}
	if window <= 0 {
		return nil
	}
	burst := float64(lim) * window.Seconds()
	if burst < 1 {
		return fmt.Errorf("with window %v allows a burst of less than one packet (limit x window must be at least 1)", window)
	}
	if burst > MaxBurst {
		return fmt.Errorf("with window %v: limit x window is %.0f packets, more than the counters hold (at most %d); "+
			"shorten the window or lower the limit", window, burst, MaxBurst)
	}
	return nil
}

// CheckLevel reports why lvl is not a level of a lattice of levels levels,
// or nil.
func CheckLevel(lvl, levels int) error {
	if lvl < 0 || lvl >= levels {
		return fmt.Errorf("level %d does not exist: levels are 0 to %d", lvl, levels-1)
	}
	return nil
}

// CheckPrefixes reports why p is not a list of source prefix lengths of an
// address of bits bits, or nil. The error reads after the list.
func CheckPrefixes(p []uint8, bits uint8) error {
	if len(p) < 1 || len(p) > MaxPrefixes {
		return fmt.Errorf("want 1 to %d prefix lengths", MaxPrefixes)
	}
	for i, l := range p {
		if l > bits {
			return fmt.Errorf("/%d is longer than %d bits", l, bits)
		}
		if i > 0 && l >= p[i-1] {
			return errors.New("lengths must be strictly decreasing (most specific first)")
		}
	}
	if p[len(p)-1] != 0 {
		return errors.New("the last prefix must be 0 (all sources), which counts the socket's total and packets that cannot be parsed")
	}
	return nil
}

// Params is a validated configuration compiled to the tables and thresholds
// that the limiter, in Go and in BPF, uses per packet.
type Params struct {
	// Nodes lists the lattice nodes in decision order: by level, most
	// specific first. A node's position in this list is also where its
	// sketch lives.
	Nodes []Node
	// Thresh is each class's limit at each node as a count per window
	// (FracBits fractional bits), or ThreshUnlimited.
	Thresh [NumClasses][MaxNodes]uint32
	// Over is the count above which a node is over its limit: Thresh plus
	// the noise margin sqrt(2*Thresh) packets (see the package doc).
	Over [NumClasses][MaxNodes]uint32
	// Lines is the length of each node's rows, in lines, by class, and
	// Base the index of its first line in the sketch memory: the rows of
	// a node follow one another, nodes follow in order, the opening class
	// first, then the established class, then the unverified class.
	// TotalLines is the size of the sketch memory in lines.
	Lines, Base [NumClasses][MaxNodes]uint32
	TotalLines  int
	// FairNode is the index of the last node (the socket's total), whose
	// cap is shared max-min fairly among the streams of FairSource, the
	// node of the level below that counts networks (/24, /48). Both are
	// -1 when there is no such level (a single prefix).
	FairNode, FairSource int
	// TotalNode is the index of the socket's total, the node that counts
	// one stream (every packet of the class) in a row of one line, or -1
	// when no node does (a per-destination-port lattice's last node
	// counts one stream per port). Each CPU counts it in a pending cell
	// of its own (see Limiter.countTotal). Either is the last node: the
	// filter's node loop (visit_nodes in internal/kernel/c/walk.h) has
	// the code of the total and of the fair total for the last node only.
	TotalNode int
	// Visited is how many of Nodes, from the first, each class's packets
	// visit: up to the class's last limited node. The nodes after it are
	// unlimited, and a count no limit judges changes no verdict, so they
	// are not counted (established connections' socket total, unlimited
	// by default, costs nothing per packet). 0 when the class has no limit.
	Visited [NumClasses]int
	// Reflect is the index of the reflection node (all sources from one
	// source port: the /0 prefix with the source port), which the screen
	// may ask before the walk, or -1 when the lattice has none after the
	// network node (a single prefix, or the destination port dimension).
	Reflect int
	// Screen says, by class, where a clean packet is screened before the
	// walk (Limiter.screen): ScreenFair at the fair total, ScreenReflect
	// at the reflection node. Either needs a limited network node
	// (FairSource) such that every node more specific than it has a limit
	// no lower than its own, so that a stream over such a node's limit is
	// over the network's too, which stops the screen for its network; and
	// a limit at the node it asks: a fair total on the socket's total, a
	// limited reflection node.
	Screen [NumClasses]uint8
	// ReturningExempt has bit i set for each node i that a returning
	// user's packet (Key.Returning) passes as if under its limit: every
	// node of a prefix shorter than the first (the source's network and
	// wider) but the last, the socket's total, where it is ranked.
	ReturningExempt uint16
	// Returning paces the returning part of the opening class's fair
	// total: ReturningShareShift of its limit (nothing when the class has
	// no fair total, or an unlimited one).
	Returning Pacing
	// ReturningLine is the line, after every node's rows, whose first
	// cell counts the packets the returning part passed (forwarded, in
	// the clean budget): the fair total ranks the others against its
	// limit less that count (Limiter.admitTotal).
	ReturningLine uint32
	// Prefix4 and Prefix6 are the prefix lengths by prefix slot.
	Prefix4, Prefix6 [MaxPrefixes]uint8
	// NumPrefixes is the number of prefix slots in use.
	NumPrefixes int
	// PerDstPort is Config.PerDstPort.
	PerDstPort bool
	// WindowNanos is the window in nanoseconds.
	WindowNanos uint64
	// G[s] = exp(s*2^SlotShift/window), Q24: the weight of a packet that
	// arrives in slot s of an epoch, relative to the epoch's start. It
	// scales thresholds to the slot.
	G [Slots]uint64
	// W[s] is G[s] as a count (FracBits fractional bits): what a packet in
	// slot s adds to a counter.
	W [Slots]uint32
	// GInv[s] = exp(-s*2^SlotShift/window), Q32: turns a weighted sum back
	// into a count as of now.
	GInv [Slots]uint64
	// D0, D1, D2 are decay factors, Q32, for an idle time of k epochs:
	// exp(-k*2^EpochShift/window) = D0[k&511]*D1[(k>>9)&511]*D2[k>>18].
	D0, D1, D2 [DecayEntries]uint64
	// FamilyWord and Mask drive the address hash, by family (0 IPv4,
	// 1 IPv6) and prefix slot: the family word hashed (the family, or 0 for
	// a /0 prefix, which IPv4 and IPv6 share) and each address word's mask.
	FamilyWord [2][MaxPrefixes]uint64
	Mask       [2][MaxPrefixes][4]uint32
}

// ThreshUnlimited marks an unlimited node in Params.Thresh and Over.
const ThreshUnlimited = ^uint32(0) // C: THRESH_UNLIMITED

// Compile validates c (after WithDefaults) and computes its Params.
func Compile(c Config) (*Params, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := &Params{
		NumPrefixes: len(c.IPv4Prefixes),
		PerDstPort:  c.PerDstPort,
		WindowNanos: uint64(c.Window.Nanoseconds()),
		FairNode:    -1,
		FairSource:  -1,
		TotalNode:   -1,
		Reflect:     -1,
	}
	copy(p.Prefix4[:], c.IPv4Prefixes)
	copy(p.Prefix6[:], c.IPv6Prefixes)
	p.Nodes = latticeOrder(p.NumPrefixes, c.PerDstPort)
	for fi, fam := range []Family{IPv4, IPv6} {
		prefixes := p.Prefix4
		if fam == IPv6 {
			prefixes = p.Prefix6
		}
		for s := range p.NumPrefixes {
			if prefixes[s] != 0 {
				p.FamilyWord[fi][s] = uint64(fam)
			}
			for i := range 4 {
				p.Mask[fi][s][i] = prefixMask(prefixes[s], i)
			}
		}
	}
	for class := range NumClasses {
		lim := c.Class(class)
		for i, n := range p.Nodes {
			l := lim.Limit
			if ll, ok := lim.LevelLimits[n.Level()]; ok {
				l = ll
			}
			t := threshold(l, p.WindowNanos)
			p.Thresh[class][i] = t
			p.Over[class][i] = overThreshold(t)
		}
	}
	for class := range NumClasses {
		for i := range p.Nodes {
			if p.Thresh[class][i] != ThreshUnlimited {
				p.Visited[class] = i + 1
			}
		}
	}
	for i := len(p.Nodes); i < MaxNodes; i++ {
		for class := range NumClasses {
			p.Thresh[class][i], p.Over[class][i] = ThreshUnlimited, ThreshUnlimited
		}
	}
	if p.NumPrefixes > 1 && !c.ProportionalTotal {
		total := NewNode(p.NumPrefixes-1, true, true)
		networks := NewNode(p.NumPrefixes-2, true, true)
		if !c.PerDstPort {
			total, networks = total&^1, networks&^1
		}
		p.FairNode, p.FairSource = slices.Index(p.Nodes, total), slices.Index(p.Nodes, networks)
		if !c.PerDstPort {
			p.Reflect = slices.Index(p.Nodes, NewNode(p.NumPrefixes-1, false, false))
		}
	}
	for class := range NumClasses {
		for i := range p.Nodes {
			lines := uint32(OpeningLines)
			switch {
			case i == len(p.Nodes)-1 && (!c.PerDstPort || p.Nodes[i].DstPortAny()):
				lines = 1 // the socket's total: one stream
				p.TotalNode = i
			case class == int(quicclass.Established):
				lines = EstablishedLines
			case class == int(quicclass.Unverified):
				lines = UnverifiedLines
			}
			p.Lines[class][i], p.Base[class][i] = lines, uint32(p.TotalLines)
			p.TotalLines += Depth * int(lines)
		}
	}
	p.ReturningLine = uint32(p.TotalLines)
	p.TotalLines++
	for class := range NumClasses {
		p.Screen[class] = screens(p, class)
	}
	for i, n := range p.Nodes[:len(p.Nodes)-1] {
		if n.Prefix() > 0 {
			p.ReturningExempt |= 1 << i
		}
	}
	if p.FairNode >= 0 {
		open := c.Class(int(quicclass.Opening))
		limit := open.Limit
		if l, ok := open.LevelLimits[p.Nodes[p.FairNode].Level()]; ok {
			limit = l
		}
		p.Returning = returningPacing(limit)
	}
	w := float64(p.WindowNanos)
	for s := range Slots {
		t := float64(uint64(s) << SlotShift)
		p.G[s] = uint64(math.Round(math.Exp(t/w) * oneQ24f))
		p.W[s] = uint32(math.Round(math.Exp(t/w) * oneF))
		p.GInv[s] = uint64(math.Round(math.Exp(-t/w) * oneQ32f))
	}
	for j := range DecayEntries {
		e := float64(uint64(j) << EpochShift)
		p.D0[j] = uint64(math.Round(math.Exp(-e/w) * oneQ32f))
		p.D1[j] = uint64(math.Round(math.Exp(-e*DecayEntries/w) * oneQ32f))
		p.D2[j] = uint64(math.Round(math.Exp(-e*DecayEntries*DecayEntries/w) * oneQ32f))
	}
	return p, nil
}

// Where the screen asks (Params.Screen), a bit each.
const (
	// ScreenFair screens at the fair total.
	ScreenFair = 1 << iota // C: SCREEN_FAIR
	// ScreenReflect screens at the reflection node.
	ScreenReflect // C: SCREEN_REFLECT
)

// screens says where class's clean packets are screened (Params.Screen):
// nowhere unless the network node has a limit and no node more specific
// than it (a prefix at most as long, any source port) has a lower one; at
// the fair total when the class has one on the socket's total, limited;
// at the reflection node when it follows the network node and is limited.
func screens(p *Params, class int) uint8 {
	if p.FairSource < 0 {
		return 0
	}
	limited := func(i int) bool { return i >= 0 && p.Thresh[class][i] != ThreshUnlimited }
	network := p.Thresh[class][p.FairSource]
	if network == ThreshUnlimited {
		return 0
	}
	for i, n := range p.Nodes {
		if n.Prefix() <= p.Nodes[p.FairSource].Prefix() && p.Thresh[class][i] < network {
			return 0
		}
	}
	var s uint8
	if p.FairNode >= 0 && p.FairNode == p.TotalNode && limited(p.FairNode) {
		s |= ScreenFair
	}
	if p.Reflect > p.FairSource && limited(p.Reflect) {
		s |= ScreenReflect
	}
	return s
}

// threshold converts a limit in packets per second into a count per window:
// floor(limit * window_ns * 2^FracBits / 1e9).
func threshold(limit uint32, windowNanos uint64) uint32 {
	if limit == Unlimited {
		return ThreshUnlimited
	}
	t := new(big.Int).SetUint64(uint64(limit))
	t.Mul(t, new(big.Int).SetUint64(windowNanos))
	t.Lsh(t, FracBits)
	t.Quo(t, big.NewInt(1e9))
	return uint32(t.Uint64())
}

// overThreshold adds the noise margin to a threshold t: two standard
// deviations, sqrt(t/2) packets each, of the decayed count of a Poisson stream
// whose rate is exactly the limit.
func overThreshold(t uint32) uint32 {
	if t == ThreshUnlimited {
		return ThreshUnlimited
	}
	packets := float64(t) / oneF
	return t + uint32(math.Round(math.Sqrt(2*packets)*oneF))
}

// PPS converts an estimate (a decayed count over one window, FracBits
// fractional bits) to packets per second.
func (p *Params) PPS(estimate uint64) float64 {
	return float64(estimate) / oneF / (float64(p.WindowNanos) / 1e9)
}

// PrefixLen returns the length of prefix slot s for family fam.
func (p *Params) PrefixLen(fam Family, s int) int {
	if fam == IPv6 {
		return int(p.Prefix6[s])
	}
	return int(p.Prefix4[s])
}

// SameShape reports whether q can replace p on a live limiter: the sketch
// layout (the node list, and so the rows) must not change.
func (p *Params) SameShape(q *Params) bool {
	return slices.Equal(p.Nodes, q.Nodes) && p.Lines == q.Lines
}

// Takes reports whether c, a configuration validated already, compiles to
// p's shape (SameShape), without compiling it: the nodes, and so the rows,
// follow from the number of prefixes and PerDstPort alone.
func (p *Params) Takes(c Config) bool {
	n := len(c.WithDefaults().IPv4Prefixes)
	return n <= MaxPrefixes && slices.Equal(p.Nodes, latticeOrder(n, c.PerDstPort))
}
