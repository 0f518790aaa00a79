//go:build linux

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// LearnServerID remembers id, a connection ID the server put in a long
// header's source connection ID, at the kernel's monotonic time: with
// VerifyIDs, datagrams to it are verified from now on. Safe for concurrent
// use.
func (f *Filter) LearnServerID(id decide.ServerID) error {
	return f.learnServerID(id, monoNow())
}

// The server IDs' table (server_ids in c/maps.h), mapped: a slot holds
// an ID in its top 32 bits, idUsed, and the ID's stamp (decide.IDStamp).
// Userspace and the program write slots with atomic operations only.
const (
	idSlotBytes = 8
	idSetBytes  = decide.IDWays * idSlotBytes
	idSets      = 1 << decide.IDSetShift // C: ID_SETS
	idStampMask = decide.IDStampMask
	idUsed      = idStampMask + 1      // C: ID_USED
	idTagMask   = ^uint64(idStampMask) // C: ID_TAG_MASK
	// idLearnTries bounds the compare-and-swap retries of a learn whose
	// set other writers keep changing.
	idLearnTries = 16
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

// mapServerIDs maps the server IDs' table.
func (f *Filter) mapServerIDs() (err error) {
	f.ids, err = mapArray(f.objs.ServerIds, "server_ids", idSets, idSetBytes)
	return err
}

// idSlot is slot i of the table (set times IDWays plus way). The memory is
// the mapping's, not Go's; it outlives every use (Close unmaps it).
func (f *Filter) idSlot(i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&f.ids[i*idSlotBytes]))
}

// idTag is what a slot holding id has in its top 33 bits.
func idTag(id decide.ServerID) uint64 {
	return uint64(id.Word())<<32 | idUsed
}

// slotID is the ID a used slot e holds.
func slotID(e uint64) decide.ServerID {
	var id decide.ServerID
	binary.BigEndian.PutUint32(id[:], uint32(e>>32))
	return id
}

// idSetFirst is the index of the first slot of the set of an ID of hash h
// (idHash).
func idSetFirst(h uint64) int {
	return int(h>>(64-decide.IDSetShift)) * decide.IDWays
}

func (f *Filter) learnServerID(id decide.ServerID, at uint64) error {
	h := f.idHash(id)
	tag, st := idTag(id), uint64(decide.IDStamp(int64(at)))
	first := idSetFirst(h)
	for range idLearnTries {
		// The ID's own slot if it has one, else a free slot, else the
		// stalest ID's. Two learners of one new ID at once may each take
		// a slot for it: the lookup finds either, and expiry clears both.
		victim, old, found := -1, uint64(0), false
		for i := first; i < first+decide.IDWays; i++ {
			e := atomic.LoadUint64(f.idSlot(i))
			switch {
			case e&idTagMask == tag:
				victim, old, found = i, e, true
			case found:
			case e&idUsed == 0:
				if victim < 0 || old&idUsed != 0 {
					victim, old = i, e
				}
			case victim < 0 || old&idUsed != 0 && e&idStampMask < old&idStampMask:
				victim, old = i, e
			}
		}
		if atomic.CompareAndSwapUint64(f.idSlot(victim), old, tag|st) {
			f.setQuick(quickIDs, h)
			return nil
		}
	}
	return fmt.Errorf("learning server connection ID %x: its set of the table kept changing over %d tries", id[:], idLearnTries)
}

// LearnPeer remembers addr, an address the server sent a datagram to, at
// the kernel's monotonic time. Safe for concurrent use.
func (f *Filter) LearnPeer(addr netip.Addr) error {
	return f.learnPeer(addr, monoNow())
}

func (f *Filter) learnPeer(addr netip.Addr, at uint64) error {
	k, err := decide.PeerKeyOf(addr)
	if err != nil {
		return err
	}
	if err := f.objs.Peers.Update(rakelimitPeerKey{Words: k}, at, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("learning peer %v: %w", addr, err)
	}
	f.setQuick(quickPeers, f.peerHash(k))
	return nil
}

// ExpireLearned forgets the server IDs and peers neither learned nor (for
// an ID) used by a verified datagram for lifetime, and returns how many of
// each. Safe for concurrent use. An ID that a datagram refreshes between
// the check of its time and its deletion (two system calls apart) is lost;
// its connection's short headers are then verified by the peer address.
func (f *Filter) ExpireLearned(lifetime time.Duration) (ids, peers int, err error) {
	now := monoNow()
	var cutoff uint64
	if d := uint64(max(lifetime, 0).Nanoseconds()); d < now {
		cutoff = now - d
	}
	return f.expireLearned(cutoff)
}

func (f *Filter) expireLearned(cutoff uint64) (ids, peers int, err error) {
	snap := f.snapQuick(quickIDs)
	ids, kept := f.expireIDs(uint64(decide.IDStamp(int64(cutoff))))
	if ids > 0 {
		hashes := make([]uint64, len(kept))
		for i, id := range kept {
			hashes[i] = f.idHash(id)
		}
		f.rebuildQuick(quickIDs, snap, hashes)
	}
	snap = f.snapQuick(quickPeers)
	peers, keptPeers, err := expireBefore[rakelimitPeerKey](f.objs.Peers, cutoff)
	if err != nil {
		return ids, peers, fmt.Errorf("expiring peers: %w", err)
	}
	if peers > 0 {
		hashes := make([]uint64, len(keptPeers))
		for i, k := range keptPeers {
			hashes[i] = f.peerHash(k.Words)
		}
		f.rebuildQuick(quickPeers, snap, hashes)
	}
	return ids, peers, nil
}

// expireIDs clears the table's slots whose stamp is before cutoff, and
// returns how many, and the IDs it kept. A slot that a datagram stamps
// between the read and the clear keeps its ID (the compare-and-swap
// fails).
func (f *Filter) expireIDs(cutoff uint64) (int, []decide.ServerID) {
	n := 0
	var kept []decide.ServerID
	for i := range idSets * decide.IDWays {
		e := atomic.LoadUint64(f.idSlot(i))
		if e&idUsed == 0 {
			continue
		}
		if e&idStampMask < cutoff && atomic.CompareAndSwapUint64(f.idSlot(i), e, 0) {
			n++
			continue
		}
		kept = append(kept, slotID(e))
	}
	return n, kept
}

// serverIDs returns the IDs the table holds, with their stamps.
func (f *Filter) serverIDs() map[decide.ServerID]int64 {
	out := map[decide.ServerID]int64{}
	for i := range idSets * decide.IDWays {
		if e := atomic.LoadUint64(f.idSlot(i)); e&idUsed != 0 {
			out[slotID(e)] = int64(e & idStampMask)
		}
	}
	return out
}

// expireChunk is how many entries one batch lookup reads.
const expireChunk = 4096

// expireBefore deletes the entries of m, a hash of K to a time, whose time
// is before cutoff, and returns how many. It reads the map in batches, and
// checks each candidate's time again just before deleting it, so that only
// a refresh in the moment between the two is lost. It also returns the keys
// it read and kept (for the quick-reject filters).
func expireBefore[K comparable](m *ebpf.Map, cutoff uint64) (int, []K, error) {
	keys, times := make([]K, expireChunk), make([]uint64, expireChunk)
	var old, kept []K
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, times, nil)
		for i := range n {
			if times[i] < cutoff {
				old = append(old, keys[i])
			} else {
				kept = append(kept, keys[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, kept, fmt.Errorf("reading: %w", err)
		}
	}
	deleted := 0
	for _, k := range old {
		var t uint64
		if err := m.Lookup(k, &t); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return deleted, kept, fmt.Errorf("reading: %w", err)
		}
		if t >= cutoff {
			kept = append(kept, k)
			continue
		}
		if err := m.Delete(k); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return deleted, kept, fmt.Errorf("deleting: %w", err)
		}
		deleted++
	}
	return deleted, kept, nil
}

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns (and, at
// the timer tick's resolution, of bpf_ktime_get_coarse_ns).
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// The quick-reject filters of the learned sets (struct quick in
// c/maps.h): a bit per bucket of a member's hash, set for every member, so
// that the program looks a source up in the hash map of peers (or a
// connection ID in the server IDs) only when its bit is set. A new source,
// every packet of a spoofed flood, then costs a read of a 32 KiB bitmap
// rather than of a hash bucket in megabytes that no cache holds.
const (
	quickShift = 18                   // C: QUICK_SHIFT
	quickWords = 1 << quickShift / 64 // C: QUICK_WORDS
	quickBytes = quickWords * 8
	quickPeers = 0 // C: QUICK_PEERS
	quickIDs   = 1 // C: QUICK_IDS
	numQuick   = 2 // C: NUM_QUICK
)

// mapQuick maps the quick-reject filters, which userspace sets bits of with
// atomic operations.
func (f *Filter) mapQuick() (err error) {
	f.quick, err = mapArray(f.objs.Quick, "quick", numQuick, quickBytes)
	return err
}

// quickWord is word i of learned set which's filter. The memory is the
// mapping's, not Go's; it outlives every use (Close unmaps it).
func (f *Filter) quickWord(which, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&f.quick[which*quickBytes+i*8]))
}

// quickBit is the bit of hash h: its word and its mask.
func quickBit(h uint64) (int, uint64) {
	b := h >> (64 - quickShift)
	return int(b / 64), 1 << (b % 64)
}

// setQuick sets the bit of hash h in learned set which's filter.
func (f *Filter) setQuick(which int, h uint64) {
	i, m := quickBit(h)
	atomic.OrUint64(f.quickWord(which, i), m)
}

// quickSet reports whether the bit of hash h is set in learned set which's
// filter.
func (f *Filter) quickSet(which int, h uint64) bool {
	i, m := quickBit(h)
	return atomic.LoadUint64(f.quickWord(which, i))&m != 0
}

// peerHash is a peer's hash for its filter (peer_hash in c/learned.h).
func (f *Filter) peerHash(k decide.PeerKey) uint64 {
	var h uint64
	for i, w := range k {
		h += f.hk.A[0][1+i] * uint64(w)
	}
	return h
}

// idHash is a server ID's hash for its filter and its set in the table
// (id_hash in c/learned.h).
func (f *Filter) idHash(id decide.ServerID) uint64 {
	return f.hk.A[1][1] * uint64(id.Word())
}

// rebuildQuick sets learned set which's filter to the bits of the members
// in live (their hashes), keeping the bits set since snap was taken, before
// the members were read: a member learned meanwhile keeps its bit, unless
// its bit was set already in snap and the read of the members missed it
// (it is then found again when it is next learned, as a live peer or ID is
// every second or so).
func (f *Filter) rebuildQuick(which int, snap []uint64, live []uint64) {
	next := make([]uint64, quickWords)
	for _, h := range live {
		i, m := quickBit(h)
		next[i] |= m
	}
	for i := range next {
		w := f.quickWord(which, i)
		for {
			old := atomic.LoadUint64(w)
			if atomic.CompareAndSwapUint64(w, old, next[i]|old&^snap[i]) {
				break
			}
		}
	}
}

// snapQuick reads learned set which's filter.
func (f *Filter) snapQuick(which int) []uint64 {
	snap := make([]uint64, quickWords)
	for i := range snap {
		snap[i] = atomic.LoadUint64(f.quickWord(which, i))
	}
	return snap
}
