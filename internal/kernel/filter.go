//go:build linux

// Package kernel loads the rakelimit socket filter (rakelimit.c and its
// headers in c/, compiled by bpf2go into the committed rakelimit_bpf*.{go,o})
// and attaches it to UDP sockets. The filter makes, in the kernel, exactly
// the decisions of its Go twin (package decide), whose configuration and
// tables it shares.
//
// What the filter learns of the server (LearnServerID, LearnPeer) and what
// clients prove lives in three learned sets (decide.LearnedSet), mmapped
// arrays of 2 MiB each with a 32 KiB quick-reject filter, which userspace
// writes with the Go twin's code (TestLearnedMemory logs what the kernel
// charges for the maps).
package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The C program and the Go twin must agree on every dimension; these fail
// to compile when they do not.
var (
	_ [1]struct{} = [len(rakelimitConfig{}.Thresh[0]) - sketch.MaxNodes + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.Thresh) - sketch.NumClasses + 1]struct{}{}
	_ [1]struct{} = [sketch.NumClasses - quicclass.LimiterClasses + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitLearnedSet{}.Slot) - decide.LearnedWays + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.LearnId) - len(sketch.HashKey{}.LearnID) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.LearnAddr) - len(sketch.HashKey{}.LearnAddr) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Verified[0]) - int(quicclass.NumVerifications) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.G) - sketch.Slots + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.D0) - sketch.DecayEntries + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA) - sketch.Depth + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.HashA[0]) - sketch.HashWords + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitConfig{}.BlockedPorts) - len(quicclass.Ports{}) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Dropped[0][0]) - sketch.MaxLevels + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Invalid[0][0]) - int(quicclass.NumReasons) + 1]struct{}{}
	_ [1]struct{} = [len(rakelimitStats{}.Passed[0]) - decide.Families + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitLine{}) - uintptr(sketch.LineBytes) + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitLine{}.Cells[0]) - uintptr(sketch.CellBytes) + 1]struct{}{}
	_ [1]struct{} = [unsafe.Sizeof(rakelimitStats{}) - unsafe.Sizeof(decide.Stats{}) + 1]struct{}{}
)

// Filter is one loaded instance of the program with its own sketches, hash
// key and configuration. It may be attached to any number of sockets, which
// then share its limits.
type Filter struct {
	objs       rakelimitObjects
	hk         sketch.HashKey
	trackShift uint8

	// sweepHook, for tests, runs in a sweep between finding the stale
	// cells and resetting them.
	sweepHook func()

	// learned are the learned sets, in mapped maps (see mapLearned);
	// mapped are the mappings, which Close unmaps.
	learned decide.Learned
	mapped  [][]byte

	mu     sync.Mutex
	cfg    decide.Config
	params *sketch.Params
	allow  allowSet
	active uint32
}

// loadOptions are switches for tests; the zero value is production.
type loadOptions struct {
	// testMode takes time and randomness from skb->cb and records the
	// verdict in the test_verdict map (see c/maps.h).
	testMode bool
	// benchRandomSource gives every packet a random source address.
	benchRandomSource bool
	// hashKey replaces the random hash key.
	hashKey *sketch.HashKey
	// trackShift, when set, replaces decide.DefaultTrackShift (0 tracks every
	// drop).
	trackShift *uint8
}

// Load loads the program and its maps into the kernel with a fresh random
// hash key, and writes the configuration. The filter does nothing until it
// is attached.
func Load(c decide.Config) (*Filter, error) {
	return load(c, loadOptions{})
}

func load(c decide.Config, o loadOptions) (_ *Filter, err error) {
	p, err := compile(&c)
	if err != nil {
		return nil, err
	}
	f := &Filter{trackShift: decide.DefaultTrackShift}
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
	// The sizes of the maps are the kernel contract's (internal/decide),
	// which the userspace limiter keeps too; the generated types do not
	// carry them, so they are checked here rather than at compile time.
	for m, want := range map[string]uint32{rakelimitMapAllow4: decide.MaxAllow, rakelimitMapAllow6: decide.MaxAllow,
		rakelimitMapStreams: decide.MaxTrackedStreams, rakelimitMapServerIds: decide.LearnedSets,
		rakelimitMapProvenPeers: decide.LearnedSets, rakelimitMapAnsweredPeers: decide.LearnedSets} {
		if n := spec.Maps[m].MaxEntries; n != want {
			return nil, fmt.Errorf("the BPF object's %s holds %d entries, internal/decide says %d", m, n, want)
		}
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
			f.Close()
		}
	}()
	if err := f.seedPRNG(); err != nil {
		return nil, err
	}
	if err := f.mapLearned(); err != nil {
		return nil, err
	}
	if err := f.initFairShares(); err != nil {
		return nil, err
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
func compile(c *decide.Config) (*sketch.Params, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return sketch.Compile(c.Limiter)
}

func unboundedShares() rakelimitFair {
	var fs rakelimitFair
	for c := range fs.Share {
		for b := range fs.Share[c] {
			fs.Share[c][b] = sketch.FairUnbounded
		}
	}
	return fs
}

// initFairShares sets every CPU's fair shares (a per-CPU map: each CPU
// finds the share from its own packets) to unbounded.
func (f *Filter) initFairShares() error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("counting CPUs: %w", err)
	}
	shares := make([]rakelimitFair, cpus)
	for i := range shares {
		shares[i] = unboundedShares()
	}
	if err := f.objs.FairShares.Update(uint32(0), shares, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("initialising the fair shares: %w", err)
	}
	return nil
}

// seedPRNG gives every CPU's xorshift generator a random non-zero state (and
// its clock no reading yet).
func (f *Filter) seedPRNG() error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("counting CPUs: %w", err)
	}
	states := make([]rakelimitCpuState, cpus)
	var b [8]byte
	for i := range states {
		for states[i].Rng == 0 {
			if _, err := rand.Read(b[:]); err != nil {
				return fmt.Errorf("seeding the filter's random numbers: %w", err)
			}
			states[i].Rng = binary.LittleEndian.Uint64(b[:])
		}
	}
	if err := f.objs.CpuState.Update(uint32(0), states, ebpf.UpdateAny); err != nil {
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

// Configure replaces the configuration of a live filter, all or nothing,
// with one switch of the configuration slot: the change governs the next
// packet, and the sketches and counters are kept. On an error the filter is
// left as it was. The lattice (prefix count and PerDstPort) cannot change,
// since the sketches are laid out for it.
func (f *Filter) Configure(c decide.Config) error {
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

// configure puts c (compiled to p) in force, or on any error leaves the
// kernel and the Go side as they were: the slot in force, the allowlist and
// what Config and Params report. New allowlist entries go in before the
// switch and old ones out after it, so that a prefix in both lists is never
// limited in between; when a trie cannot hold both lists, its old-only
// entries go first: their sources are then limited a moment early, never
// exempted late.
func (f *Filter) configure(c decide.Config, p *sketch.Params) (err error) {
	next := newAllowSet(c.Allow)
	var add, drop []allowEntry
	var total [2]int
	for e := range next {
		if !f.allow[e] {
			add = append(add, e)
		}
	}
	for e := range f.allow {
		if !next[e] {
			drop = append(drop, e)
		}
	}
	for e := range f.allow {
		total[e.family()]++
	}
	for _, e := range add {
		total[e.family()]++
	}
	early := total[0] > decide.MaxAllow || total[1] > decide.MaxAllow
	// The undo log: entries added and removed so far, and whether the
	// switch happened.
	var added, removed []allowEntry
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
		for _, e := range added {
			if uerr := f.allowDelete(e); uerr != nil {
				undo = append(undo, fmt.Errorf("removing a new allowlist entry: %w", uerr))
			}
		}
		for _, e := range removed {
			if uerr := f.allowAdd(e); uerr != nil {
				undo = append(undo, fmt.Errorf("restoring an allowlist entry: %w", uerr))
			}
		}
		if len(undo) > 0 {
			err = fmt.Errorf("%w; undoing it: %w", err, errors.Join(undo...))
		}
	}()
	removeOld := func() error {
		for _, e := range drop {
			if err := f.allowDelete(e); err != nil {
				return fmt.Errorf("removing %v from the allowlist: %w", e.prefix(), err)
			}
			removed = append(removed, e)
		}
		return nil
	}
	if early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	for _, e := range add {
		if err := f.allowAdd(e); err != nil {
			return fmt.Errorf("adding %v to the allowlist: %w", e.prefix(), err)
		}
		added = append(added, e)
	}
	slot := 1 - f.active
	if err := f.objs.Configs.Update(slot, f.compiled(c, p, next), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the filter configuration: %w", err)
	}
	if err := f.objs.ActiveConfig.Update(uint32(0), slot, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("switching the filter configuration: %w", err)
	}
	switched = true
	if !early {
		if err := removeOld(); err != nil {
			return err
		}
	}
	f.active, f.params, f.cfg, f.allow = slot, p, c, next
	return nil
}

// ActiveSlot returns the configuration slot in force (0 or 1), as the
// kernel reads it.
func (f *Filter) ActiveSlot() (uint32, error) {
	var slot uint32
	if err := f.objs.ActiveConfig.Lookup(uint32(0), &slot); err != nil {
		return 0, fmt.Errorf("reading the active configuration slot: %w", err)
	}
	return slot, nil
}

// AllowEntries counts the prefixes in the kernel's allowlists.
func (f *Filter) AllowEntries() (int, error) {
	n := 0
	var k4 rakelimitAllow4Key
	var k6 rakelimitAllow6Key
	var v uint8
	it := f.objs.Allow4.Iterate()
	for it.Next(&k4, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading the IPv4 allowlist: %w", err)
	}
	it = f.objs.Allow6.Iterate()
	for it.Next(&k6, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading the IPv6 allowlist: %w", err)
	}
	return n, nil
}

// compiled is the kernel's configuration for c, p and the allowlist next.
func (f *Filter) compiled(c decide.Config, p *sketch.Params, next allowSet) *rakelimitConfig {
	var k rakelimitConfig
	k.Thresh, k.Over, k.Lines, k.Base = p.Thresh, p.Over, p.Lines, p.Base
	k.G, k.W, k.Ginv = p.G, p.W, p.GInv
	k.D0, k.D1, k.D2 = p.D0, p.D1, p.D2
	k.HashA, k.HashB, k.RankA, k.RankB = f.hk.A, f.hk.B, f.hk.R, f.hk.RB
	k.LearnId, k.LearnAddr = f.hk.LearnID, f.hk.LearnAddr
	k.FamilyWord, k.Mask = p.FamilyWord, p.Mask
	for i, n := range p.Nodes {
		k.Nodes[i] = uint8(n)
	}
	for class, n := range p.Visited {
		k.Visited[class] = uint8(n)
		k.Screen[class] = p.Screen[class]
	}
	k.NumPrefixes = uint8(p.NumPrefixes)
	k.PerDport = boolByte(p.PerDstPort)
	k.FairNode, k.FairSource = nodeIndex(p.FairNode), nodeIndex(p.FairSource)
	k.TotalNode = nodeIndex(p.TotalNode)
	k.ReflectNode = nodeIndex(p.Reflect)
	k.Classify = boolByte(c.Classify)
	k.VerifyIds = boolByte(c.VerifyIDs)
	if c.BlockedPorts != nil {
		k.BlockedPorts = *c.BlockedPorts
	}
	pacing := decide.NewPacing(c.Negotiation)
	k.VnInterval, k.VnTau = pacing.Interval, pacing.Tau
	tick := coarseTick()
	k.CoarseClock = boolByte(coarseClockFits(tick, p.WindowNanos))
	k.TickNs = tick
	k.DryRun = boolByte(c.DryRun)
	k.AllowAny = boolByte(len(next) > 0)
	k.AllowFilter, k.AllowAlways = allowFilter(c.Allow)
	k.TrackMask = 1<<f.trackShift - 1
	track := decide.TrackPacing()
	k.TrackInterval, k.TrackTau = track.Interval, track.Tau
	return &k
}

// coarseTicks is how many ticks of the kernel's coarse clock a window must
// last for the filter to read that clock, once per tick and CPU, rather than
// the precise one, which costs more than the rest of a drop: a packet's time
// is then off by at most 1/coarseTicks of the window.
const coarseTicks = 100

// coarseClockFits reports whether a window of windowNanos lasts the
// coarseTicks ticks of tick ns (0: unknown) that the coarse clock needs.
func coarseClockFits(tick, windowNanos uint64) bool {
	return tick > 0 && tick*coarseTicks <= windowNanos
}

// coarseTick is the timer tick's length in ns (1 to 10 ms), the resolution
// of the kernel's coarse clock, or 0 when the kernel does not say.
func coarseTick() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil || ts.Nano() <= 0 {
		return 0
	}
	return uint64(ts.Nano())
}

// nodeIndex is a node index as the C program takes it: 0xff for none.
func nodeIndex(i int) uint8 {
	if i < 0 {
		return 0xff
	}
	return uint8(i)
}

// Config returns the configuration in force.
func (f *Filter) Config() decide.Config {
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
func (f *Filter) Stats() (decide.Stats, error) {
	var per []rakelimitStats
	if err := f.objs.Counters.Lookup(uint32(0), &per); err != nil {
		return decide.Stats{}, fmt.Errorf("reading the filter counters: %w", err)
	}
	var s decide.Stats
	for i := range per {
		// The layouts are the same: the size check above, and the
		// differential tests compare every counter.
		s.Add((*decide.Stats)(unsafe.Pointer(&per[i])))
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
	lines := int(f.objs.Cells.MaxEntries())
	page := unix.Getpagesize()
	size := (lines*sketch.LineBytes + page - 1) / page * page
	// The cells map is BPF_F_MMAPABLE: mapped here, its cells are reset
	// one at a time with atomic operations, never through a copy of a
	// line that packets may have counted in since it was read.
	mem, err := unix.Mmap(f.objs.Cells.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mapping the sketches: %w", err)
	}
	defer unix.Munmap(mem)
	var stale []int
	for off := 0; off < lines*sketch.LineBytes; off += sketch.LineBytes {
		for c := off; c < off+sketch.CellsPerLine*sketch.CellBytes; c += sketch.CellBytes {
			if sketch.Stale(atomic.LoadUint32(word(mem, c)), epoch) {
				stale = append(stale, c)
			}
		}
	}
	if f.sweepHook != nil {
		f.sweepHook()
	}
	swept := 0
	for _, c := range stale {
		if resetCell(mem, c, epoch) {
			swept++
		}
	}
	if err := f.sweepPending(epoch); err != nil {
		return swept, err
	}
	return swept, nil
}

// sweepPending moves the CPUs' stale pending counts of the socket's total
// (count_total; those of a class without packets on a CPU for the horizon)
// to epoch, as sketch.Limiter.Sweep does, so that no pending epoch idles
// long enough to wrap. They are not counted as swept. A per-CPU map is
// written whole: a CPU that counted in its pending cell between the read
// and the write loses those packets' counts (at most the packets of that
// moment, once a day, and only when some CPU has a stale one).
func (f *Filter) sweepPending(epoch uint32) error {
	var all []rakelimitPending
	if err := f.objs.Totals.Lookup(uint32(0), &all); err != nil {
		return fmt.Errorf("reading the pending totals: %w", err)
	}
	changed := false
	for i := range all {
		for c := range all[i].Cell {
			cl := &all[i].Cell[c]
			if sketch.Stale(cl.Epoch, epoch) {
				cl.Epoch = epoch
				for b := range cl.Budget {
					cl.Budget[b].Offered, cl.Budget[b].Forwarded = 0, 0
				}
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	if err := f.objs.Totals.Update(uint32(0), all, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("sweeping the pending totals: %w", err)
	}
	return nil
}

// word is the 32-bit word at offset off of the mapped sketches. The map's
// memory is not Go's: the pointer is to the mapping, which outlives its use.
func word(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[off]))
}

// resetCell resets the cell at offset c of the mapped sketches to epoch if
// it is still stale, and reports whether it did. A packet that touches a
// stale cell first moves its epoch (rescale's compare-and-swap), so each
// counter is cleared only if it still holds the value read with the stale
// epoch, and the epoch is moved last, only if no packet moved it: a packet
// counted in the cell meanwhile keeps its count, and the cell is then the
// packet's (and not counted as swept).
func resetCell(mem []byte, c int, epoch uint32) bool {
	e := atomic.LoadUint32(word(mem, c))
	if !sketch.Stale(e, epoch) {
		return false
	}
	// The counters follow the epoch: two budgets of offered and forwarded.
	for off := c + 4; off < c+sketch.CellBytes; off += 4 {
		if v := atomic.LoadUint32(word(mem, off)); v != 0 {
			atomic.CompareAndSwapUint32(word(mem, off), v, 0)
		}
	}
	return atomic.CompareAndSwapUint32(word(mem, c), e, epoch)
}

// Info describes the loaded program's size.
type Info struct {
	// Instructions is the number of BPF instructions after verification.
	Instructions int
	// MapBytes is the memory of the maps' keys and values: sketches,
	// configuration, per-CPU counters, tracked streams, learned server IDs
	// and peers, and the event ring buffer (the allowlist, allocated per
	// entry, is left out; so is the kernel's bookkeeping per entry of the
	// hash maps, which for the learned sets is several times their keys
	// and values).
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
		f.objs.FairShares, f.objs.Pacer, f.objs.ServerIds, f.objs.ProvenPeers, f.objs.AnsweredPeers, f.objs.Quick} {
		in.MapBytes += int(m.MaxEntries() * (m.KeySize() + m.ValueSize()))
	}
	in.SketchBytes = int(f.objs.Cells.MaxEntries() * f.objs.Cells.ValueSize())
	in.MapBytes += int(f.objs.Events.MaxEntries()) // ring buffer bytes
	for _, m := range []*ebpf.Map{f.objs.Counters, f.objs.CpuState} {
		in.MapBytes += cpus * int(m.ValueSize())
	}
	return in, nil
}

// Close releases the filter's file descriptors. Sockets it is attached to
// keep the program and maps alive until they close or detach it.
func (f *Filter) Close() error {
	f.learned = decide.Learned{}
	for _, mem := range f.mapped {
		if err := unix.Munmap(mem); err != nil {
			return fmt.Errorf("unmapping a learned set: %w", err)
		}
	}
	f.mapped = nil
	return f.objs.Close()
}
