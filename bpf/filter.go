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

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// The C program and the Go limiter must agree on every dimension; these
// fail to compile when they do not.
var (
	_ [1]struct{} = [len(rakelimitConfig{}.Thresh) - sketch.MaxNodes + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.G) - sketch.Slots + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.D0) - sketch.DecayEntries + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA) - sketch.Depth + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA[0]) - sketch.HashWords + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.Prefix4) - sketch.MaxPrefixes + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Dropped[0]) - sketch.MaxLevels + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitCell{}) - uintptr(sketch.CellBytes) + 1]struct{}{}
)

// Families is the number of address families the counters distinguish:
// index 0 counts packets the filter could not parse, 1 IPv4, 2 IPv6.
const Families = 3

// FamilyIndex returns the counters' index of a family.
func FamilyIndex(f sketch.Family) int {
	switch f {
	case sketch.IPv4:
		return 1
	case sketch.IPv6:
		return 2
	}
	return 0
}

// Stats are the filter's packet counters, summed over CPUs.
type Stats struct {
	// Passed counts packets let through, by family.
	Passed [Families]uint64
	// Limited counts packets let through although a node found their
	// stream over its limit, by family and the level of that node.
	Limited [Families][sketch.MaxLevels]uint64
	// Dropped counts dropped packets by family and the level of the node
	// that dropped them.
	Dropped [Families][sketch.MaxLevels]uint64
	// WouldDrop counts, in a dry run, the packets that would have been
	// dropped and were delivered, by family and level.
	WouldDrop [Families][sketch.MaxLevels]uint64
	// Allowed counts allowlisted packets, by family.
	Allowed [Families]uint64
	// Errors counts packets passed because the program could not reach
	// its state; it stays zero unless the load is broken.
	Errors uint64
}

// Unlimited counts the packets of a family that passed under every limit:
// those passed less those limited somewhere.
func (s *Stats) Unlimited(fam int) uint64 {
	n := s.Passed[fam]
	for _, l := range s.Limited[fam] {
		n -= l
	}
	return n
}

// Filter is one loaded instance of the program with its own sketches, hash
// key and configuration. It may be attached to any number of sockets, which
// then share its limits.
type Filter struct {
	objs rakelimitObjects
	hk   sketch.HashKey

	mu     sync.Mutex
	params *sketch.Params
	opts   Options
	allow  map[rakelimitAllowKey]bool
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
}

// Load compiles c, loads the program and its maps into the kernel with a
// fresh random hash key, and writes the configuration. The filter does
// nothing until it is attached.
func Load(c sketch.Config) (*Filter, error) {
	return load(c, loadOptions{})
}

func load(c sketch.Config, o loadOptions) (_ *Filter, err error) {
	p, err := sketch.Compile(c)
	if err != nil {
		return nil, err
	}
	f := &Filter{opts: Options{TrackShift: DefaultTrackShift}}
	if o.hashKey != nil {
		f.hk = *o.hashKey
	} else if f.hk, err = sketch.NewHashKey(nil); err != nil {
		return nil, err
	}
	spec, err := loadRakelimit()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded BPF object: %w", err)
	}
	spec.Maps[rakelimitMapCells].MaxEntries = uint32(len(p.Nodes) * sketch.Depth * sketch.Width)
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
	// Start on slot 1 so that the first write lands in slot 0.
	f.active = 1
	if err := f.apply(p); err != nil {
		return nil, err
	}
	return f, nil
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

// Update replaces the configuration of a live filter. The change governs the
// next packet; the sketches and counters are kept. The lattice (prefix count
// and PerDstPort) cannot change, since the sketches are laid out for it.
func (f *Filter) Update(c sketch.Config) error {
	p, err := sketch.Compile(c)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.params.SameShape(p) {
		return fmt.Errorf("cannot change the lattice (prefix count or per-destination-port) of a loaded filter: %d nodes to %d",
			len(f.params.Nodes), len(p.Nodes))
	}
	return f.applyLocked(p)
}

func (f *Filter) apply(p *sketch.Params) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyLocked(p)
}

// applyLocked writes p into the inactive configuration slot and then
// switches the program to it, so that no packet sees half a configuration.
func (f *Filter) applyLocked(p *sketch.Params) error {
	var c rakelimitConfig
	copy(c.Thresh[:], p.Thresh)
	copy(c.Over[:], p.Over)
	c.G, c.Ginv = p.G, p.GInv
	c.D0, c.D1, c.D2 = p.D0, p.D1, p.D2
	c.HashA, c.HashB = f.hk.A, f.hk.B
	c.FamilyWord, c.Mask = p.FamilyWord, p.Mask
	for i, n := range p.Nodes {
		c.Nodes[i] = uint8(n)
	}
	c.Prefix4, c.Prefix6 = p.Prefix4, p.Prefix6
	c.NumNodes = uint8(len(p.Nodes))
	c.NumPrefixes = uint8(p.NumPrefixes)
	c.PerDport = boolByte(p.PerDstPort)
	c.DryRun = boolByte(f.opts.DryRun)
	c.AllowAny = boolByte(len(f.allow) > 0)
	c.AllowFilter, c.AllowAlways = allowFilter(f.opts.Allow)
	c.TrackMask = 1<<f.opts.TrackShift - 1

	next := 1 - f.active
	if err := f.objs.Configs.Update(next, &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the filter configuration: %w", err)
	}
	if err := f.objs.ActiveConfig.Update(uint32(0), next, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("switching the filter configuration: %w", err)
	}
	f.active, f.params = next, p
	return nil
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

// Stats reads the packet counters, summed over CPUs.
func (f *Filter) Stats() (Stats, error) {
	var per []rakelimitStats
	if err := f.objs.Counters.Lookup(uint32(0), &per); err != nil {
		return Stats{}, fmt.Errorf("reading the filter counters: %w", err)
	}
	var s Stats
	for _, c := range per {
		for fam := range Families {
			s.Passed[fam] += c.Passed[fam]
			s.Allowed[fam] += c.Allowed[fam]
			for l := range sketch.MaxLevels {
				s.Limited[fam][l] += c.Limited[fam][l]
				s.Dropped[fam][l] += c.Dropped[fam][l]
				s.WouldDrop[fam][l] += c.WouldDrop[fam][l]
			}
		}
		s.Errors += c.Errors
	}
	return s, nil
}

// Info describes the loaded program's size.
type Info struct {
	// Instructions is the number of BPF instructions after verification.
	Instructions int
	// MapBytes is the memory of the maps' keys and values: sketches,
	// configuration, per-CPU counters, tracked streams and the event ring
	// buffer (the allowlist, allocated per entry, is left out).
	MapBytes int
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
	for _, m := range []*ebpf.Map{f.objs.Cells, f.objs.Configs, f.objs.ActiveConfig, f.objs.TestVerdict, f.objs.Streams} {
		in.MapBytes += int(m.MaxEntries() * (m.KeySize() + m.ValueSize()))
	}
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
