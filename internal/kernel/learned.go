//go:build linux

package kernel

import (
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// The learned sets (server_ids, proven_peers, answered_peers and their
// quick-reject filters in c/maps.h) and the answered peers' credits
// (answered_credit) are mmapped arrays, which userspace writes with the Go
// twin's own code (decide.LearnedSet, decide.Credit) through the mappings,
// with atomic operations only, as the program does.
const (
	// learnedSetBytes is the size of one set of a learned set (struct
	// learned_set), a cache line.
	learnedSetBytes = decide.LearnedWays * 8
	// quickBytes is the size of one quick-reject filter (struct quick).
	quickBytes = decide.QuickWords * 8
	// creditSetBytes is the size of the credits of one set of the
	// answered peers (struct credit_set).
	creditSetBytes = decide.LearnedWays * 4
)

// mapArray maps the memory of m, an mmappable array that must hold entries
// values of valueSize bytes each (what this package's constants say of the
// C program's); name is the map's name in the C program, for errors.
func mapArray(m *ebpf.Map, name string, entries, valueSize int) ([]byte, error) {
	if n, v := int(m.MaxEntries()), int(m.ValueSize()); n != entries || v != valueSize {
		return nil, fmt.Errorf("the BPF object's %s map holds %d values of %d bytes, want %d of %d", name, n, v,
			entries, valueSize)
	}
	mem, err := unix.Mmap(m.FD(), 0, entries*valueSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the BPF map %s: %w", name, err)
	}
	return mem, nil
}

// words views mapped memory as 64-bit words. The memory is the mapping's,
// not Go's; it outlives every use (Close unmaps it).
func words(mem []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), len(mem)/8)
}

// mapLearned maps the three learned sets and their quick-reject filters.
func (f *Program) mapLearned() error {
	quick, err := mapArray(f.objs.Quick, "quick", decide.NumLearned, quickBytes)
	if err != nil {
		return err
	}
	f.mapped = append(f.mapped, quick)
	sets := [decide.NumLearned]struct {
		m    *ebpf.Map
		name string
		set  **decide.LearnedSet
	}{
		decide.LearnedIDs:      {f.objs.ServerIds, "server_ids", &f.learned.IDs},
		decide.LearnedProven:   {f.objs.ProvenPeers, "proven_peers", &f.learned.Proven},
		decide.LearnedAnswered: {f.objs.AnsweredPeers, "answered_peers", &f.learned.Answered},
	}
	for i, s := range sets {
		mem, err := mapArray(s.m, s.name, decide.LearnedSets, learnedSetBytes)
		if err != nil {
			return err
		}
		f.mapped = append(f.mapped, mem)
		q := words(quick[i*quickBytes : (i+1)*quickBytes])
		if *s.set, err = decide.LearnedSetOn(words(mem), q); err != nil {
			return fmt.Errorf("the BPF map %s: %w", s.name, err)
		}
	}
	credit, err := mapArray(f.objs.AnsweredCredit, "answered_credit", decide.LearnedSets, creditSetBytes)
	if err != nil {
		return err
	}
	f.mapped = append(f.mapped, credit)
	counters := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(credit))), len(credit)/4)
	if f.learned.Credit, err = decide.CreditOn(counters); err != nil {
		return fmt.Errorf("the BPF map answered_credit: %w", err)
	}
	return nil
}

// LearnServerID binds id, a connection ID the server put in a long
// header's source connection ID, to to, the address the server sent it
// to, at the kernel's monotonic time: with VerifyIDs, datagrams from to
// carrying it are verified from now on. Safe for concurrent use.
func (f *Program) LearnServerID(id decide.ServerID, to netip.Addr) error {
	return f.learned.LearnServerID(&f.hk, id, to, int64(monoNow()))
}

// LearnPeer records that the server sent a connection's packet to addr,
// at the kernel's monotonic time (decide.Learned.LearnPeer). Safe for
// concurrent use.
func (f *Program) LearnPeer(addr netip.Addr) error {
	return f.learned.LearnPeer(&f.hk, addr, int64(monoNow()))
}

// Grant adds credits to addr, an answered peer (decide.Learned.Grant).
// Safe for concurrent use.
func (f *Program) Grant(addr netip.Addr, credits int) error {
	return f.learned.Grant(&f.hk, addr, credits)
}

// Learned returns the filter's learned sets, in the kernel's memory.
func (f *Program) Learned() decide.Learned { return f.learned }

// AdoptLearned takes over the keys of another engine's learned sets, each
// stamped now (the other engine's clock is not the kernel's).
func (f *Program) AdoptLearned(from decide.Learned) {
	f.learned.CopyFrom(from, decide.Stamp(int64(monoNow())))
}

// ExpireLearned forgets the keys of each learned set neither learned nor
// used for lifetime, and returns how many of each. Safe for concurrent
// use; it reads and writes the mapped sets, with no system call (the
// error is always nil). A key
// that a datagram refreshes between the read of its slot and its clearing
// is kept (the compare-and-swap fails).
func (f *Program) ExpireLearned(lifetime time.Duration) ([decide.NumLearned]int, error) {
	return f.learned.Expire(int64(monoNow()), decide.LifetimeStamps(lifetime.Nanoseconds())), nil
}

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns (and, at
// the timer tick's resolution, of bpf_ktime_get_coarse_ns).
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
