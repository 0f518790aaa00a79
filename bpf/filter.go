//go:build linux

// Package bpf loads the rakelimit socket filter (rakelimit.c, compiled by
// bpf2go into the committed rakelimit_bpf*.{go,o}) and attaches it to UDP
// sockets. The filter makes, in the kernel, exactly the decisions of the Go
// limiter in internal/sketch, whose configuration and tables it shares.
package bpf

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// The C program and the Go twin must agree on every dimension; these fail
// to compile when they do not.
var (
	_ [1]struct{} = [len(rakelimitConfig{}.Thresh[0]) - sketch.MaxNodes + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.Thresh) - sketch.NumClasses + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.G) - sketch.Slots + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.D0) - sketch.DecayEntries + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA) - sketch.Depth + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA[0]) - sketch.HashWords + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.BlockedPorts) - len(quicclass.Ports{}) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Dropped[0][0]) - sketch.MaxLevels + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Invalid[0][0]) - int(quicclass.NumReasons) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Passed[0]) - datagram.Families + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitLine{}) - uintptr(sketch.LineBytes) + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitLine{}.Cells[0]) - uintptr(sketch.CellBytes) + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitStats{}) - unsafe.Sizeof(datagram.Stats{}) + 1]struct{}{}
)

// MaxAllow is the most allowlist prefixes of one family the filter holds
// (MAX_ALLOW in rakelimit.c).
const MaxAllow = 1024

// Filter is one loaded instance of the program with its own sketches, hash
// key and configuration. It may be attached to any number of sockets, which
// then share its limits.
type Filter struct {
	objs       rakelimitObjects
	hk         sketch.HashKey
	trackShift uint8

	mu     sync.Mutex
	cfg    datagram.Config
	params *sketch.Params
	allow  allowSet
	active uint32
}

// loadOptions are switches for tests; the zero value is production.
type loadOptions struct {
	// testMode takes time and randomness from skb->cb and records the
	// verdict in the test_verdict map (see rakelimit.c).
	testMode bool
	// benchRandomSource gives every packet a random source address.
	benchRandomSource bool
	// hashKey replaces the random hash key.
	hashKey *sketch.HashKey
	// trackShift, when set, replaces DefaultTrackShift (0 tracks every
	// drop).
	trackShift *uint8
}

// Load loads the program and its maps into the kernel with a fresh random
// hash key, and writes the configuration. The filter does nothing until it
// is attached.
func Load(c datagram.Config) (*Filter, error) {
	return load(c, loadOptions{})
}

func load(c datagram.Config, o loadOptions) (_ *Filter, err error) {
	p, err := compile(&c)
	if err != nil {
		return nil, err
	}
	f := &Filter{trackShift: DefaultTrackShift}
	if o.trackShift != nil {
		f.trackShift = *o.trackShift
	}
	if o.hashKey != nil {
		f.hk = *o.hashKey
	} else if f.hk, err = sketch.NewHashKey(nil); err != nil {
		return nil, err
	}
	spec, err := loadRakelimit()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded BPF object: %w", err)
	}
	spec.Maps[rakelimitMapCells].MaxEntries = uint32(p.TotalLines)
	for name, on := range map[string]bool{
		rakelimitVarTestMode:          o.testMode,
		rakelimitVarBenchRandomSource: o.benchRandomSource,
	} {
		if err := spec.Variables[name].Set(boolByte(on)); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	if err := spec.LoadAndAssign(&f.objs, nil); err != nil {
		return nil, explainLoad(err)
	}
	defer func() {
		if err != nil {
			f.objs.Close()
		}
	}()
	if err := f.seedPRNG(); err != nil {
		return nil, err
	}
	if err := f.objs.FairShares.Update(uint32(0), unboundedShares(), ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("initialising the fair shares: %w", err)
	}
	// Start on slot 1 so that the first write lands in slot 0.
	f.active = 1
	f.allow = allowSet{}
	f.params = p
	if err := f.configure(c, p); err != nil {
		return nil, err
	}
	return f, nil
}

// compile validates a configuration and compiles its limiter.
func compile(c *datagram.Config) (*sketch.Params, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := checkAllowCapacity(c.Allow); err != nil {
		return nil, err
	}
	return sketch.Compile(c.Limiter)
}

func unboundedShares() *rakelimitFair {
	var fs rakelimitFair
	for c := range fs.Share {
		for b := range fs.Share[c] {
			fs.Share[c][b] = sketch.FairUnbounded
		}
	}
	return &fs
}

// seedPRNG gives every CPU's xorshift generator a random non-zero state.
func (f *Filter) seedPRNG() error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("counting CPUs: %w", err)
	}
	seeds := make([]uint64, cpus)
	var b [8]byte
	for i := range seeds {
		for seeds[i] == 0 {
			if _, err := rand.Read(b[:]); err != nil {
				return fmt.Errorf("seeding the filter's random numbers: %w", err)
			}
			seeds[i] = binary.LittleEndian.Uint64(b[:])
		}
	}
	if err := f.objs.Prng.Update(uint32(0), seeds, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("seeding the filter's random numbers: %w", err)
	}
	return nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// explainLoad turns the kernel's refusal into an error that says what to do.
func explainLoad(err error) error {
	var ve *ebpf.VerifierError
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("loading the rakelimit BPF socket filter: %w: the process needs CAP_BPF "+
			"(kernel.unprivileged_bpf_disabled is %s); grant it with `setcap cap_bpf+ep /path/to/caddy` "+
			"or, under systemd, AmbientCapabilities=CAP_BPF and CapabilityBoundingSet=CAP_BPF",
			err, sysctl("kernel/unprivileged_bpf_disabled"))
	case errors.As(err, &ve):
		return fmt.Errorf("loading the rakelimit BPF socket filter: the kernel verifier rejected it: %+v", ve)
	}
	return fmt.Errorf("loading the rakelimit BPF socket filter: %w", err)
}

func sysctl(name string) string {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// Configure replaces the configuration of a live filter, all or nothing,
// with one switch of the configuration slot: the change governs the next
// packet, and the sketches and counters are kept. On an error the filter is
// left as it was. The lattice (prefix count and PerDstPort) cannot change,
// since the sketches are laid out for it.
func (f *Filter) Configure(c datagram.Config) error {
	p, err := compile(&c)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.params.SameShape(p) {
		return fmt.Errorf("cannot change the lattice (prefix count or per-destination-port) of a loaded filter: %d nodes to %d",
			len(f.params.Nodes), len(p.Nodes))
	}
	return f.configure(c, p)
}

// configure puts c (compiled to p) in force. Allowlist entries new in c are
// added before the switch and the ones c drops are removed after it, so that
// a prefix in both lists is never limited in between; if anything fails
// before the switch, what was added is removed again.
func (f *Filter) configure(c datagram.Config, p *sketch.Params) (err error) {
	next := newAllowSet(c.Allow)
	var added []allowEntry
	defer func() {
		if err != nil {
			for _, e := range added {
				_ = f.allowDelete(e) // best effort: it was just added
			}
		}
	}()
	for e := range next {
		if !f.allow[e] {
			if err := f.allowAdd(e); err != nil {
				return fmt.Errorf("adding %v to the allowlist: %w", e.prefix(), err)
			}
			added = append(added, e)
		}
	}
	cfg := f.compiled(c, p, next)
	slot := 1 - f.active
	if err := f.objs.Configs.Update(slot, cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the filter configuration: %w", err)
	}
	if err := f.objs.ActiveConfig.Update(uint32(0), slot, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("switching the filter configuration: %w", err)
	}
	prev := f.allow
	f.active, f.params, f.cfg, f.allow = slot, p, c, next
	// From here on the new configuration is in force: an entry that
	// cannot be removed stays in the trie, outside the quick-reject
	// filter's buckets unless another prefix shares them, and the next
	// change tries again.
	var stale []error
	for e := range prev {
		if !next[e] {
			if err := f.allowDelete(e); err != nil {
				f.allow[e] = true
				stale = append(stale, err)
			}
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("removing from the allowlist: %w", errors.Join(stale...))
	}
	return nil
}

// compiled is the kernel's configuration for c, p and the allowlist next.
func (f *Filter) compiled(c datagram.Config, p *sketch.Params, next allowSet) *rakelimitConfig {
	var k rakelimitConfig
	k.Thresh, k.Over, k.Lines, k.Base = p.Thresh, p.Over, p.Lines, p.Base
	k.G, k.W, k.Ginv = p.G, p.W, p.GInv
	k.D0, k.D1, k.D2 = p.D0, p.D1, p.D2
	k.HashA, k.HashB, k.RankA, k.RankB = f.hk.A, f.hk.B, f.hk.R, f.hk.RB
	k.FamilyWord, k.Mask = p.FamilyWord, p.Mask
	for i, n := range p.Nodes {
		k.Nodes[i] = uint8(n)
	}
	k.NumNodes = uint8(len(p.Nodes))
	k.NumPrefixes = uint8(p.NumPrefixes)
	k.PerDport = boolByte(p.PerDstPort)
	k.FairNode, k.FairSource = nodeIndex(p.FairNode), nodeIndex(p.FairSource)
	k.Classify = boolByte(c.Classify)
	if c.BlockedPorts != nil {
		k.BlockedPorts = *c.BlockedPorts
	}
	pacing := datagram.NewPacing(c.Negotiation)
	k.VnInterval, k.VnTau = pacing.Interval, pacing.Tau
	k.DryRun = boolByte(c.DryRun)
	k.AllowAny = boolByte(len(next) > 0)
	k.AllowFilter, k.AllowAlways = allowFilter(c.Allow)
	k.TrackMask = 1<<f.trackShift - 1
	return &k
}

// nodeIndex is a node index as the C program takes it: 0xff for none.
func nodeIndex(i int) uint8 {
	if i < 0 {
		return 0xff
	}
	return uint8(i)
}

// Config returns the configuration in force.
func (f *Filter) Config() datagram.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}

// Params returns the configuration in force.
func (f *Filter) Params() *sketch.Params {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.params
}

// Attach attaches the filter to a socket, replacing any filter it had. The
// kernel keeps the program alive while the socket lives, even after Close.
func (f *Filter) Attach(conn syscall.Conn) error {
	if err := link.AttachSocketFilter(conn, f.objs.Rakelimit); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("attaching the rakelimit socket filter: %w: the socket's option memory is exhausted; "+
				"raise net.core.optmem_max (now %s bytes), e.g. sysctl -w net.core.optmem_max=262144",
				err, sysctl("net/core/optmem_max"))
		}
		return fmt.Errorf("attaching the rakelimit socket filter: %w", err)
	}
	return nil
}

// Detach removes whatever socket filter conn has.
func Detach(conn syscall.Conn) error {
	if err := link.DetachSocketFilter(conn); err != nil {
		return fmt.Errorf("detaching the socket filter: %w", err)
	}
	return nil
}

// Stats reads the datagram counters, summed over CPUs.
func (f *Filter) Stats() (datagram.Stats, error) {
	var per []rakelimitStats
	if err := f.objs.Counters.Lookup(uint32(0), &per); err != nil {
		return datagram.Stats{}, fmt.Errorf("reading the filter counters: %w", err)
	}
	var s datagram.Stats
	for i := range per {
		// The layouts are the same: the size check above, and the
		// differential tests compare every counter.
		s.Add((*datagram.Stats)(unsafe.Pointer(&per[i])))
	}
	return s, nil
}

// Sweep resets the sketch cells idle for so long that their 32-bit epoch
// could wrap (see sketch.Limiter.Sweep); the filter's owner runs it at least
// daily. It returns how many cells it reset.
func (f *Filter) Sweep() (int, error) {
	return f.sweep(uint32(newMonoClock().now >> sketch.EpochShift))
}

func (f *Filter) sweep(epoch uint32) (int, error) {
	n := int(f.objs.Cells.MaxEntries())
	keys, lines := make([]uint32, n), make([]sketch.Line, n)
	var cursor ebpf.MapBatchCursor
	got, err := f.objs.Cells.BatchLookup(&cursor, keys, lines, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("reading the sketches: %w", err)
	}
	swept := 0
	for i := range got {
		changed := false
		for j := range lines[i].Cells {
			if sketch.Stale(lines[i].Cells[j].Epoch, epoch) {
				lines[i].Cells[j] = sketch.Cell{Epoch: epoch}
				changed = true
				swept++
			}
		}
		// A packet may touch the line between the read and this write
		// and lose its count: a stale cell is rarely touched, and then
		// by one packet.
		if changed {
			if err := f.objs.Cells.Update(keys[i], &lines[i], ebpf.UpdateExist); err != nil {
				return swept, fmt.Errorf("resetting stale cells: %w", err)
			}
		}
	}
	return swept, nil
}

// Info describes the loaded program's size.
type Info struct {
	// Instructions is the number of BPF instructions after verification.
	Instructions int
	// MapBytes is the memory of the maps' keys and values: sketches,
	// configuration, per-CPU counters, tracked streams and the event ring
	// buffer (the allowlist, allocated per entry, is left out).
	MapBytes int
	// SketchBytes is the memory of the sketches alone.
	SketchBytes int
}

// Info reports the program's instruction count and map memory.
func (f *Filter) Info() (Info, error) {
	pi, err := f.objs.Rakelimit.Info()
	if err != nil {
		return Info{}, fmt.Errorf("reading program info: %w", err)
	}
	insns, err := pi.Instructions()
	if err != nil {
		return Info{}, fmt.Errorf("reading program instructions: %w", err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return Info{}, err
	}
	var in Info
	in.Instructions = len(insns)
	for _, m := range []*ebpf.Map{f.objs.Cells, f.objs.Configs, f.objs.ActiveConfig, f.objs.TestVerdict, f.objs.Streams,
		f.objs.FairShares, f.objs.Pacer} {
		in.MapBytes += int(m.MaxEntries() * (m.KeySize() + m.ValueSize()))
	}
	in.SketchBytes = int(f.objs.Cells.MaxEntries() * f.objs.Cells.ValueSize())
	in.MapBytes += int(f.objs.Events.MaxEntries()) // ring buffer bytes
	for _, m := range []*ebpf.Map{f.objs.Counters, f.objs.Prng} {
		in.MapBytes += cpus * int(m.ValueSize())
	}
	return in, nil
}

// Close releases the filter's file descriptors. Sockets it is attached to
// keep the program and maps alive until they close or detach it.
func (f *Filter) Close() error {
	return f.objs.Close()
}
