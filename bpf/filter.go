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
	"slices"
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
	if n := spec.Maps[rakelimitMapAllowlist].MaxEntries; n != MaxAllow {
		return nil, fmt.Errorf("the BPF object's allowlist holds %d prefixes, the loader expects MaxAllow = %d", n, MaxAllow)
	}
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
	if err := f.configure(p, f.opts); err != nil {
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

// LoadError is the kernel's refusal to load the filter. Its message is one
// line that names the cause and what to do; the verifier's log, which can
// run to thousands of lines, is kept apart for the caller to log at DEBUG.
type LoadError struct {
	msg string
	// VerifierLog is the kernel verifier's log, when it produced one.
	VerifierLog []string
	err         error
}

// Error returns the one-line explanation.
func (e *LoadError) Error() string { return e.msg }

// Unwrap returns the kernel's error number (or the library's error when
// there is none), so that errors.Is(err, unix.EPERM) holds.
func (e *LoadError) Unwrap() error { return e.err }

// explainLoad turns the kernel's refusal into a one-line error that says
// what to do. It leaves out the BPF library's RLIMIT_MEMLOCK hint: from
// Linux 5.11 BPF memory is charged to the memory cgroup, not to MEMLOCK, and
// the filter needs 5.12 or later.
func explainLoad(err error) error {
	return explain(err, missingCapabilities())
}

// explain is explainLoad for a process that lacks the capabilities missing.
func explain(err error, missing []string) error {
	e := &LoadError{err: err}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		e.VerifierLog = ve.Log
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		e.err = errno
	}
	const what = "loading the rakelimit BPF socket filter"
	switch {
	case len(missing) > 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)):
		e.msg = fmt.Sprintf("%s: %v: the process lacks %s (it needs CAP_BPF and CAP_PERFMON); grant them with "+
			"`setcap cap_bpf,cap_perfmon,cap_net_bind_service+ep %s` or, under systemd, "+
			"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE (see Privileges in the README)",
			what, e.err, strings.Join(missing, " and "), executable())
	case ve != nil:
		e.msg = fmt.Sprintf("%s: the kernel verifier rejected it (%v): %s (the whole log is at DEBUG level)",
			what, e.err, lastLine(ve.Log))
	case errors.Is(err, unix.EPERM):
		e.msg = fmt.Sprintf("%s: %v although the process has CAP_BPF and CAP_PERFMON: a seccomp filter, a security "+
			"module or kernel lockdown forbids it (kernel.unprivileged_bpf_disabled is %s)",
			what, e.err, sysctl("kernel/unprivileged_bpf_disabled"))
	default:
		// Only EPERM carries the library's MEMLOCK hint.
		e.msg = fmt.Sprintf("%s: %v", what, err)
	}
	return e
}

// missingCapabilities names the capabilities the process lacks to load the
// filter: CAP_BPF and CAP_PERFMON, both implied by CAP_SYS_ADMIN.
func missingCapabilities() []string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if has(unix.CAP_SYS_ADMIN) {
		return nil
	}
	var out []string
	for _, c := range []struct {
		bit  int
		name string
	}{{unix.CAP_BPF, "CAP_BPF"}, {unix.CAP_PERFMON, "CAP_PERFMON"}} {
		if !has(c.bit) {
			out = append(out, c.name)
		}
	}
	return out
}

// executable is the path of the running binary, for the setcap hint.
func executable() string {
	p, err := os.Executable()
	if err != nil {
		return "/path/to/caddy"
	}
	return p
}

// lastLine is the verifier's conclusion: the last line of its log that is
// not the statistics summary.
func lastLine(log []string) string {
	for i := len(log) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(log[i]); l != "" && !strings.HasPrefix(l, "processed ") &&
			!strings.HasPrefix(l, "verification time") && !strings.HasPrefix(l, "stack depth") {
			return l
		}
	}
	return "no log"
}

func sysctl(name string) string {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// Update replaces the limiter configuration of a live filter and keeps its
// options; see Configure.
func (f *Filter) Update(c sketch.Config) error {
	f.mu.Lock()
	o := f.opts
	f.mu.Unlock()
	return f.Configure(c, o)
}

// Configure puts a limiter configuration and options in force on the live
// filter, all or nothing, from the next packet; the sketches and counters
// are kept. It checks everything first (the configuration, the lattice,
// which cannot change since the sketches are laid out for it, and the
// allowlist's size), then adds the new allowlist entries, writes the
// inactive configuration slot, switches to it once, and removes the old
// entries. On any error it undoes what it did: the slot in force, the
// allowlist and what Params and the options report stay as they were.
func (f *Filter) Configure(c sketch.Config, o Options) error {
	p, err := sketch.Compile(c)
	if err != nil {
		return err
	}
	return f.configure(p, o)
}

func (f *Filter) configure(p *sketch.Params, o Options) (err error) {
	if o.TrackShift > 31 {
		return fmt.Errorf("track shift %d out of range [0, 31]", o.TrackShift)
	}
	next := map[rakelimitAllowKey]bool{}
	for _, a := range o.Allow {
		next[allowKey(a)] = true
	}
	if len(next) > MaxAllow {
		return fmt.Errorf("allow: %d prefixes, more than the %d the kernel's allowlist holds", len(next), MaxAllow)
	}
	o.Allow = slices.Clone(o.Allow)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.params != nil && !f.params.SameShape(p) {
		return fmt.Errorf("cannot change the lattice (prefix count or per-destination-port) of a loaded filter: %d nodes to %d",
			len(f.params.Nodes), len(p.Nodes))
	}
	var add, drop []rakelimitAllowKey
	for k := range next {
		if !f.allow[k] {
			add = append(add, k)
		}
	}
	for k := range f.allow {
		if !next[k] {
			drop = append(drop, k)
		}
	}
	// Undo log: entries added and removed so far, and whether the switch
	// happened.
	var added, removed []rakelimitAllowKey
	prevSlot, switched := f.active, false
	defer func() {
		if err == nil {
			return
		}
		var undo []error
		if switched {
			if e := f.objs.ActiveConfig.Update(uint32(0), prevSlot, ebpf.UpdateAny); e != nil {
				undo = append(undo, fmt.Errorf("switching back: %w", e))
			}
		}
		for _, k := range added {
			if e := f.objs.Allowlist.Delete(k); e != nil && !errors.Is(e, ebpf.ErrKeyNotExist) {
				undo = append(undo, fmt.Errorf("removing a new allowlist entry: %w", e))
			}
		}
		for _, k := range removed {
			if e := f.objs.Allowlist.Update(k, uint8(1), ebpf.UpdateAny); e != nil {
				undo = append(undo, fmt.Errorf("restoring an allowlist entry: %w", e))
			}
		}
		if len(undo) > 0 {
			err = fmt.Errorf("%w; undoing it: %w", err, errors.Join(undo...))
		}
	}()
	removeOld := func() error {
		for _, k := range drop {
			if e := f.objs.Allowlist.Delete(k); e != nil && !errors.Is(e, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("removing from the allowlist: %w", e)
			}
			removed = append(removed, k)
		}
		return nil
	}
	// New entries go in before the switch and old ones out after it, so
	// that a prefix in both lists is never limited in between. When the
	// trie cannot hold both lists, the old-only entries go first: their
	// sources are then limited a moment early, never exempted late.
	early := len(f.allow)+len(add) > MaxAllow
	if early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	for _, k := range add {
		if e := f.objs.Allowlist.Update(k, uint8(1), ebpf.UpdateAny); e != nil {
			return fmt.Errorf("adding to the allowlist: %w", e)
		}
		added = append(added, k)
	}
	slot := 1 - f.active
	cfg := f.slotConfig(p, o, len(next) > 0)
	if e := f.objs.Configs.Update(slot, &cfg, ebpf.UpdateAny); e != nil {
		return fmt.Errorf("writing the filter configuration: %w", e)
	}
	if e := f.objs.ActiveConfig.Update(uint32(0), slot, ebpf.UpdateAny); e != nil {
		return fmt.Errorf("switching the filter configuration: %w", e)
	}
	switched = true
	if !early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	f.active, f.params, f.opts, f.allow = slot, p, o, next
	return nil
}

// slotConfig is the content of a configuration slot for p and o.
func (f *Filter) slotConfig(p *sketch.Params, o Options, allowAny bool) rakelimitConfig {
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
	c.DryRun = boolByte(o.DryRun)
	c.AllowAny = boolByte(allowAny)
	c.AllowFilter, c.AllowAlways = allowFilter(o.Allow)
	c.TrackMask = 1<<o.TrackShift - 1
	return c
}

// ActiveSlot reads which of its two configuration slots the program reads
// now; every Configure that succeeds switches it once. For diagnostics and
// tests.
func (f *Filter) ActiveSlot() (uint32, error) {
	var slot uint32
	if err := f.objs.ActiveConfig.Lookup(uint32(0), &slot); err != nil {
		return 0, fmt.Errorf("reading the active configuration slot: %w", err)
	}
	return slot, nil
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
