package decide

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// What the filter learns from the server's own datagrams (see
// quicclass): the connection IDs it issues and the addresses it sends to,
// as many as given here (the bpf package checks that its object agrees).
// The kernel keeps the IDs in a set-associative table of 2 MiB (IDWays),
// the peers in a preallocated LRU hash map of about 11 MiB. The Go twin
// bounds its tables alike and grows them as it learns: about 7 MiB and
// 10 MiB when full.
const (
	// ServerIDLen is the length of the server's connection IDs: quic-go's
	// are 4 random bytes.
	ServerIDLen = quicclass.ServerIDLen
	// MaxServerIDs is how many server connection IDs are remembered: a
	// busy server's connections, a few IDs each (quic-go issues a few per
	// connection and rotates them). When the set is full, a new ID evicts
	// one rather than being refused: in the kernel, the stalest of the
	// IDWays of its set; in the Go twin, the one the clock hand picks.
	MaxServerIDs = 1 << 17 // C: MAX_SERVER_IDS
	// IDWays and IDSetShift shape the kernel's table of server IDs: sets
	// of IDWays slots of 8 bytes, a cache line, 2^IDSetShift of them; an
	// ID's set is the top IDSetShift bits of its hash. The table has twice
	// MaxServerIDs slots: a set fills before the table does, and at half
	// full the sets hold all but about 1% of random IDs (at full, 14%
	// would find their set full).
	IDWays     = 8  // C: ID_WAYS
	IDSetShift = 15 // C: ID_SET_SHIFT
	// MaxPeers is how many peer addresses are remembered, evicted as the
	// least recently used.
	MaxPeers = 1 << 17 // C: MAX_PEERS
	// IDStampShift gives the unit of a server ID's time, its stamp (see
	// IDStamp): 2^30 ns, 1.07 s. A verified datagram writes the stamp of
	// its ID again when it is behind: one write per ID a second at most,
	// not one per datagram.
	IDStampShift = 30 // C: ID_STAMP_SHIFT
	// IDStampMask keeps a stamp in the 31 bits a slot of the kernel's
	// table has for it (68 years).
	IDStampMask = 1<<31 - 1 // C: ID_STAMP_MASK
	// ipv4MappedWord is the third word of an IPv4 address as a peer key
	// holds it, IPv4-mapped (::ffff:a.b.c.d).
	ipv4MappedWord = 0xffff // C: IPV4_MAPPED_WORD
)

// IDStamp is time now (nanoseconds, monotonic) as a server ID's time is
// kept: in units of 2^IDStampShift ns, so that the kernel keeps an ID and
// its time in one 8-byte word. An ID is expired once its stamp is before
// the stamp of the cutoff: up to one unit after it was last used. A time
// before the clock's zero (a cutoff older than the clock) is stamp 0.
func IDStamp(now int64) int64 {
	return max(now, 0) >> IDStampShift & IDStampMask
}

// Word is the ID as a big-endian number: how the kernel's table and hash
// take it.
func (id ServerID) Word() uint32 { return binary.BigEndian.Uint32(id[:]) }

// ServerID is a connection ID the server issued, as the server's long
// headers carry it in their source connection ID.
type ServerID [ServerIDLen]byte

// PeerKey is a peer address as the filter keys it: the 16 bytes of the
// address as four big-endian words, an IPv4 address IPv4-mapped
// (::ffff:a.b.c.d).
type PeerKey [4]uint32

// PeerKeyOf returns the key of addr, or an error for an invalid address.
func PeerKeyOf(addr netip.Addr) (PeerKey, error) {
	if !addr.IsValid() {
		return PeerKey{}, fmt.Errorf("peer address %v: want an IPv4 or IPv6 address", addr)
	}
	b := addr.Unmap().As16() // an IPv4 address maps
	var k PeerKey
	for i := range k {
		k[i] = uint32(b[4*i])<<24 | uint32(b[4*i+1])<<16 | uint32(b[4*i+2])<<8 | uint32(b[4*i+3])
	}
	return k, nil
}

// peerKey is the peer key of a datagram's source, as the C program builds
// it from the words it parsed; false for an unknown family.
func peerKey(k *sketch.Key) (PeerKey, bool) {
	switch k.Family {
	case sketch.IPv4:
		return PeerKey{0, 0, ipv4MappedWord, k.Words[0]}, true
	case sketch.IPv6:
		return PeerKey(k.Words), true
	}
	return PeerKey{}, false
}

// Addr returns the address of k (IPv4 unmapped).
func (k PeerKey) Addr() netip.Addr {
	var b [16]byte
	for i, w := range k {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w>>24), byte(w>>16), byte(w>>8), byte(w)
	}
	return netip.AddrFrom16(b).Unmap()
}

// learned is a bounded set of keys, each with the time it was last learned
// or used. When full, a new key evicts one chosen by the clock (second
// chance) algorithm: a key looked up since the hand last passed is spared
// once, which approximates the kernel's LRU map. Slots are allocated as the
// set grows, up to max.
type learned[K comparable] struct {
	max   int
	index map[K]int32
	slots []learnedSlot[K]
	free  []int32
	hand  ClockHand
}

type learnedSlot[K comparable] struct {
	key  K
	last int64
	used bool
	// ref is set by every lookup.
	ref bool
}

func newLearned[K comparable](max int) learned[K] {
	return learned[K]{max: max, index: map[K]int32{}}
}

// lookup returns the time of k, or nil when k is not in the set.
func (t *learned[K]) lookup(k K) *int64 {
	i, ok := t.index[k]
	if !ok {
		return nil
	}
	s := &t.slots[i]
	s.ref = true
	return &s.last
}

// learn adds k at time now, or sets its time to now.
func (t *learned[K]) learn(k K, now int64) {
	if i, ok := t.index[k]; ok {
		t.slots[i].last = now
		return
	}
	var i int32
	switch n := len(t.free); {
	case n > 0:
		i, t.free = t.free[n-1], t.free[:n-1]
	case len(t.slots) < t.max:
		i = int32(len(t.slots))
		t.slots = append(t.slots, learnedSlot[K]{})
	default:
		i = t.evict()
	}
	t.slots[i] = learnedSlot[K]{key: k, last: now, used: true}
	t.index[k] = i
}

// evict frees the slot the clock hand settles on; the set is full.
func (t *learned[K]) evict() int32 {
	i := t.hand.Victim(len(t.slots), func(i int) bool {
		s := &t.slots[i]
		spared := s.ref
		s.ref = false
		return spared
	})
	delete(t.index, t.slots[i].key)
	return int32(i)
}

// expire forgets the keys whose time is before before and returns how many.
func (t *learned[K]) expire(before int64) int {
	n := 0
	for i := range t.slots {
		if s := &t.slots[i]; s.used && s.last < before {
			delete(t.index, s.key)
			*s = learnedSlot[K]{}
			t.free = append(t.free, int32(i))
			n++
		}
	}
	return n
}

// all returns the keys and their times.
func (t *learned[K]) all() map[K]int64 {
	out := make(map[K]int64, len(t.index))
	for k, i := range t.index {
		out[k] = t.slots[i].last
	}
	return out
}

// LearnServerID remembers id, a connection ID the server put in a long
// header's source connection ID, at time now (nanoseconds, monotonic),
// kept as its stamp (IDStamp).
func (f *Filter) LearnServerID(id ServerID, now int64) { f.ids.learn(id, IDStamp(now)) }

// LearnPeer remembers addr, an address the server sent a datagram to, at
// time now.
func (f *Filter) LearnPeer(addr netip.Addr, now int64) error {
	k, err := PeerKeyOf(addr)
	if err != nil {
		return err
	}
	f.peers.learn(k, now)
	return nil
}

// ExpireLearned forgets the server IDs and peers last learned or used before
// before (an ID: whose stamp is before before's), and returns how many of
// each.
func (f *Filter) ExpireLearned(before int64) (ids, peers int) {
	return f.ids.expire(IDStamp(before)), f.peers.expire(before)
}

// ServerIDs returns the server IDs remembered, with the stamp (IDStamp) of
// the time each was last learned or used; for tests that compare state with
// the BPF program.
func (f *Filter) ServerIDs() map[ServerID]int64 { return f.ids.all() }

// Peers returns the peers remembered, with the time each was last learned;
// for tests that compare state with the BPF program.
func (f *Filter) Peers() map[PeerKey]int64 { return f.peers.all() }
