package datagram

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/secondchance"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// What the filter learns from the server's own datagrams (see
// quicclass): the connection IDs it issues and the addresses it sends to.
// The kernel keeps each set in an LRU hash map of the size given here (the
// bpf package checks that its object agrees), preallocated: about 10 MiB
// for the IDs and 11 MiB for the peers. The Go twin bounds its tables
// alike and grows them as it learns: about 7 MiB and 10 MiB when full.
const (
	// ServerIDLen is the length of the server's connection IDs: quic-go's
	// are 4 random bytes.
	ServerIDLen = quicclass.ServerIDLen
	// MaxServerIDs is how many server connection IDs are remembered: a
	// busy server's connections, a few IDs each (quic-go issues a few per
	// connection and rotates them). When the set is full, a new ID evicts
	// the least recently used one rather than being refused.
	MaxServerIDs = 1 << 17
	// MaxPeers is how many peer addresses are remembered, evicted alike.
	MaxPeers = 1 << 17
	// IDRefresh is how stale a server ID's last use must be before a
	// verified datagram that uses it writes the time again: one write a
	// second per ID at most, not one per datagram.
	IDRefresh = time.Second
)

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
		return PeerKey{0, 0, 0xffff, k.Words[0]}, true
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
	hand  secondchance.Hand
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
// header's source connection ID, at time now (nanoseconds, monotonic).
func (f *Filter) LearnServerID(id ServerID, now int64) { f.ids.learn(id, now) }

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
// before, and returns how many of each.
func (f *Filter) ExpireLearned(before int64) (ids, peers int) {
	return f.ids.expire(before), f.peers.expire(before)
}

// ServerIDs returns the server IDs remembered, with the time each was last
// learned or used; for tests that compare state with the BPF program.
func (f *Filter) ServerIDs() map[ServerID]int64 { return f.ids.all() }

// Peers returns the peers remembered, with the time each was last learned;
// for tests that compare state with the BPF program.
func (f *Filter) Peers() map[PeerKey]int64 { return f.peers.all() }
