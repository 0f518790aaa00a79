//go:build linux

// Package kernel loads the rakelimit socket filter (rakelimit.c and its
// headers in c/, compiled by bpf2go into the committed rakelimit_bpf*.{go,o})
// and attaches it to UDP sockets. The filter makes, in the kernel, exactly
// the decisions of its Go twin (package decide), whose configuration and
// tables it shares. The same object holds an XDP program (LoadXDP), the
// same decision over the same maps at the driver, which xdp.go attaches to
// network interfaces and tells which listeners' datagrams to decide.
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
	"fmt"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
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

// Program is one loaded instance of the BPF program: its socket filter and,
// loaded with LoadXDP, its XDP program, over one set of maps with its own
// sketches, hash key and configuration. It may be attached to any number of
// sockets (and interfaces), which then share its limits.
type Program struct {
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
	// listening are the XDP program's listener addresses (SetListeners);
	// xdpOn the interfaces it runs on (AttachXDP).
	listening map[rakelimitListenKey]bool
	xdpOn     map[uint32]bool
}

// loadOptions are switches for tests; the zero value is production.
type loadOptions struct {
	// testMode loads the test entries (rakelimit_test, rakelimit_xdp_test;
	// see c/pkt.h) in place of the production ones: they take the time
	// and the random number from the test (skb->cb, the XDP metadata) and
	// record the verdict in the test_verdict map.
	testMode bool
	// benchRandomSource loads the benchmark entries
	// (rakelimit_bench_random, rakelimit_xdp_bench_random) in place of the
	// production ones: they give every packet a random source address.
	benchRandomSource bool
	// hashKey replaces the random hash key.
	hashKey *sketch.HashKey
	// trackShift, when set, replaces decide.DefaultTrackShift (0 tracks every
	// drop).
	trackShift *uint8
	// xdp loads the XDP program too (LoadXDP).
	xdp bool
}

// testListenAddrs is the room for listener addresses of a test-mode
// filter with its XDP program: every port of two addresses, and more.
const testListenAddrs = 1 << 18

// Load loads the socket filter and its maps into the kernel, and writes
// the configuration. The filter does nothing until it is attached. hk is
// its hash key, nil for a fresh random one: a filter that takes over what
// another engine learned (AdoptLearned) must hash with that engine's key.
func Load(c decide.Config, hk *sketch.HashKey) (*Program, error) {
	return load(c, loadOptions{hashKey: hk})
}

// LoadXDP loads the filter as Load does, with its XDP program (mode xdp),
// which shares its maps. The XDP program is left out of Load: it needs
// Linux 5.18 (bpf_xdp_load_bytes), and its verification costs the start
// of a limiter that never attaches it another second or more.
func LoadXDP(c decide.Config, hk *sketch.HashKey) (*Program, error) {
	return load(c, loadOptions{xdp: true, hashKey: hk})
}

// HashKey returns the filter's hash key.
func (f *Program) HashKey() sketch.HashKey { return f.hk }

func load(c decide.Config, o loadOptions) (_ *Program, err error) {
	p, err := c.Compile()
	if err != nil {
		return nil, err
	}
	f := &Program{trackShift: decide.DefaultTrackShift}
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
	if err := setMarkKey(spec); err != nil {
		return nil, err
	}
	if o.testMode && o.xdp {
		// Room for a test's listener on every port of two addresses
		// (listenEverywhere in the tests).
		spec.Maps[rakelimitMapListenAddrs].MaxEntries = testListenAddrs
	}
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
	socket, xdp, err := o.entries()
	if err != nil {
		return nil, err
	}
	// The filter knows its programs by the production entries' names
	// (loadObjects): a test's entries are loaded in their place.
	spec.Programs[rakelimitProgRakelimit] = spec.Programs[socket]
	spec.Programs[rakelimitProgRakelimitXdp] = spec.Programs[xdp]
	caps := loadCaps
	if o.xdp {
		caps = loadXDPCaps
	}
	if err := withCapabilities(caps, func() error { return f.loadObjects(spec, o.xdp) }); err != nil {
		f.objs.Close() // loaded, when lowering the capabilities failed
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

// entries returns the names of the programs o loads as the socket filter
// and the XDP program: the production entries, or a test's or a
// benchmark's (c/pkt.h).
func (o loadOptions) entries() (socket, xdp string, err error) {
	switch {
	case o.testMode && o.benchRandomSource:
		return "", "", fmt.Errorf("a filter loads the test entries or the benchmark entries, not both")
	case o.testMode:
		return rakelimitProgRakelimitTest, rakelimitProgRakelimitXdpTest, nil
	case o.benchRandomSource:
		return rakelimitProgRakelimitBenchRandom, rakelimitProgRakelimitXdpBenchRandom, nil
	}
	return rakelimitProgRakelimit, rakelimitProgRakelimitXdp, nil
}

// socketObjects are the objects of a filter without its XDP program: the
// maps, the variables and the socket filter.
type socketObjects struct {
	rakelimitMaps
	rakelimitVariables
	Rakelimit *ebpf.Program `ebpf:"rakelimit"`
}

// setMarkKey writes a random key of the passed datagrams' marks into spec
// (mark_key, c/listen.h): a sender who does not know it cannot build a
// datagram that the socket filter takes for one the XDP program passed.
func setMarkKey(spec *ebpf.CollectionSpec) error {
	var key [2 * passedMarkWords]uint32
	if err := binary.Read(rand.Reader, binary.LittleEndian, &key); err != nil {
		return fmt.Errorf("drawing the XDP marks' key: %w", err)
	}
	if err := spec.Variables[rakelimitVarMarkKey].Set(key); err != nil {
		return fmt.Errorf("setting %s: %w", rakelimitVarMarkKey, err)
	}
	return nil
}

// loadObjects loads the maps, the variables and the socket filter of spec,
// and with xdp the XDP program: a program left out of the objects assigned
// is not loaded (neither is any entry of the object but the two, the test
// and benchmark entries among them, so that their verification costs a
// filter's start nothing). Its system calls (map creation, program load and
// verification) are the only ones of a filter's life that need CAP_BPF
// and CAP_PERFMON (and with xdp CAP_NET_ADMIN): load runs it with them
// raised (withCapabilities). What follows, the maps' writes, reads and
// mappings through their file descriptors and SO_ATTACH_BPF on a socket of
// the process, needs none.
func (f *Program) loadObjects(spec *ebpf.CollectionSpec, xdp bool) error {
	if !xdp {
		var objs socketObjects
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			return err
		}
		f.objs.rakelimitMaps, f.objs.rakelimitVariables, f.objs.Rakelimit = objs.rakelimitMaps, objs.rakelimitVariables, objs.Rakelimit
		return nil
	}
	var objs struct {
		socketObjects
		RakelimitXdp *ebpf.Program `ebpf:"rakelimit_xdp"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return err
	}
	f.objs.rakelimitMaps, f.objs.rakelimitVariables = objs.rakelimitMaps, objs.rakelimitVariables
	f.objs.Rakelimit, f.objs.RakelimitXdp = objs.Rakelimit, objs.RakelimitXdp
	return nil
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
func (f *Program) initFairShares() error {
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
func (f *Program) seedPRNG() error {
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

// Close releases the filter's file descriptors. Sockets it is attached to
// keep the program and maps alive until they close or detach it.
func (f *Program) Close() error {
	f.learned = decide.Learned{}
	for _, mem := range f.mapped {
		if err := unix.Munmap(mem); err != nil {
			return fmt.Errorf("unmapping a learned set: %w", err)
		}
	}
	f.mapped = nil
	return f.objs.Close()
}
