package decide

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// What the filter knows of the server, learned from the server's own
// datagrams (package learn) and from what clients prove, kept in three
// learned sets of one shape (the C program's in internal/kernel/c/learned.h):
//
//   - the server IDs: each connection ID the server chose, bound to the
//     address it was sent to. The key is the ID and the address together,
//     so an ID verifies only a datagram from that address: from anywhere
//     else the lookup finds another key, and misses. The set a key takes is
//     its address's alone (BoundHash), so one address holds at most
//     LearnedWays IDs however many the server is made to send there;
//   - the proven peers: the addresses that proved they receive what the
//     server sends them, by sending back an ID the server sent there (the
//     return routability of RFC 9000 section 8) in a long header, while
//     the proof pacer has room (Filter.Decide; ProofAttemptsPerSecond).
//     The filter adds an address itself, on the first such datagram from
//     it (the ID's slot is then marked, so that the next ones do not add
//     it again); the learner keeps it while the server keeps sending to
//     it;
//   - the answered peers: the addresses the server sends a connection's
//     packets to, which a spoofed Initial the server answers makes one of,
//     each with its credit beside it (Credit): what the server's datagrams
//     to it granted, less what its datagrams the filter verified by it
//     spent.
//
// A set is an array of LearnedSets sets of LearnedWays 8-byte slots, one
// cache line a set, in the kernel an mmapped BPF array that userspace and
// the program write with atomic operations only. A key's 64-bit hash (a
// multiply-add hash under the filter's secret key, universal over the key's
// words: two keys collide in a hash's top 32 bits with a probability of
// about 2^-32, which covers the set and the first bits of the tag; the
// rest of the 38-bit tag only makes a miss likelier) picks its set (the
// top LearnedSetShift bits) and its tag (the TagBits after them); a slot
// holds the tag, SlotUsed, SlotMark and the key's stamp, its time in units
// of 2^StampShift ns (1.07 s). A key not in its set takes an empty slot,
// else the stalest one's. Each set has a quick-reject filter beside it, a
// bitmap of 2^QuickShift bits with the bit of every member's hash set, so
// that a key of no member (a spoofed flood's) costs a bit read rather than
// a read of a cache line in megabytes that no cache holds. The Go twin
// keeps the same arrays and writes them with the same code (this file), so
// that both forget the same keys at and above capacity.
const (
	// ServerIDLen is the length of the server's connection IDs: quic-go's
	// are 4 random bytes.
	ServerIDLen = quicclass.ServerIDLen
	// LearnedWays is the number of slots of a set: 8 slots of 8 bytes, a
	// cache line.
	LearnedWays = 8 // C: LEARNED_WAYS
	// LearnedSetShift is the number of hash bits that pick a set.
	LearnedSetShift = 15 // C: LEARNED_SET_SHIFT
	// LearnedSets is the number of sets of a learned set: 2 MiB of slots.
	LearnedSets = 1 << LearnedSetShift // C: LEARNED_SETS
	// LearnedSlots is the number of slots of a learned set.
	LearnedSlots = LearnedSets * LearnedWays
	// MaxLearned is how many keys a learned set is sized for: half its
	// slots. A set fills before the table does; at half full the sets
	// hold all but about 1% of random keys (at full, 14% would find their
	// set full and evict its stalest key).
	MaxLearned = LearnedSlots / 2
	// StampShift gives the unit of a key's time, its stamp: 2^30 ns, 1.07
	// s. A verified datagram writes its ID's stamp again when it is
	// behind: one write per ID a second at most, not one per datagram.
	StampShift = 30 // C: STAMP_SHIFT
	// StampBits is the width of a stamp. Stamps wrap (every 208 days of
	// the monotonic clock): they are compared by their age, modulo
	// 2^StampBits, which is younger than half the range for every live
	// key, since keys are expired within a minute.
	StampBits = 24 // C: STAMP_BITS
	// StampMask keeps a stamp's bits.
	StampMask = 1<<StampBits - 1 // C: STAMP_MASK
	// SlotUsed marks a slot that holds a key.
	SlotUsed = 1 << StampBits // C: SLOT_USED
	// SlotMark is a server ID's: the address it is bound to has proven
	// itself through it (it is a proven peer).
	SlotMark = SlotUsed << 1 // C: SLOT_MARK
	// TagShift places a key's tag in its slot, above the stamp and the
	// two flags: TagBits of the hash, after the set's bits.
	TagShift = StampBits + 2 // C: TAG_SHIFT
	// TagBits is the width of a tag.
	TagBits = 64 - TagShift
	// SlotKeyMask keeps what identifies a slot's key: its tag and
	// SlotUsed.
	SlotKeyMask = ^uint64(SlotMark | StampMask) // C: SLOT_KEY_MASK
	// QuickShift is the number of hash bits that pick a key's bit in its
	// set's quick-reject filter: 2^18 bits, 32 KiB.
	QuickShift = 18 // C: QUICK_SHIFT
	// QuickWords is the number of 64-bit words of a quick-reject filter.
	QuickWords = 1 << QuickShift / 64 // C: QUICK_WORDS
	// The learned sets, as the C program indexes their quick-reject
	// filters.
	LearnedIDs      = 0 // C: LEARNED_IDS
	LearnedProven   = 1 // C: LEARNED_PROVEN
	LearnedAnswered = 2 // C: LEARNED_ANSWERED
	NumLearned      = 3 // C: NUM_LEARNED
	// halfStamps is half the range of stamps: an age at or past it is a
	// stamp from the future (written by a clock a moment ahead).
	halfStamps = 1 << (StampBits - 1)
	// learnTries bounds the compare-and-swap retries of a write whose set
	// other writers keep changing.
	learnTries = 16
)

// Stamp is time now (nanoseconds, monotonic) as a learned key's time is
// kept: in units of 2^StampShift ns, modulo 2^StampBits. A time before the
// clock's zero is stamp 0.
func Stamp(now int64) uint32 {
	return uint32(uint64(max(now, 0))>>StampShift) & StampMask
}

// StampAge is how many stamps st is after the stamp of slot e, modulo
// 2^StampBits.
func StampAge(st uint32, e uint64) uint32 {
	return (st - uint32(e)) & StampMask
}

// ServerID is a connection ID the server issued, as the server's long
// headers carry it in their source connection ID.
type ServerID [ServerIDLen]byte

// Word is the ID as a big-endian number: how the hash takes it.
func (id ServerID) Word() uint32 { return binary.BigEndian.Uint32(id[:]) }

// PeerKey is an address as the learned sets key it: the 16 bytes of the
// address as four big-endian words, an IPv4 address IPv4-mapped
// (::ffff:a.b.c.d).
type PeerKey [4]uint32

// ipv4MappedWord is the third word of an IPv4-mapped address.
const ipv4MappedWord = 0xffff // C: IPV4_MAPPED_WORD

// PeerKeyOf returns the key of addr, or an error for an invalid address.
func PeerKeyOf(addr netip.Addr) (PeerKey, error) {
	if !addr.IsValid() {
		return PeerKey{}, fmt.Errorf("peer address %v: want an IPv4 or IPv6 address", addr)
	}
	b := addr.Unmap().As16() // an IPv4 address maps
	var k PeerKey
	for i := range k {
		k[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	return k, nil
}

// peerKey is the peer key of a datagram's source, as the C program builds
// it from the words it parsed (peer_key_of); false for an unknown family.
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
		binary.BigEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b).Unmap()
}

// BoundHash is the hash of server ID id bound to address pk: its key in
// the server IDs' set (bound_hash in learned.h). Its set (the top
// LearnedSetShift bits) is the address's alone, so that the IDs bound to
// one address share one set and are at most LearnedWays: a guess from an
// address can hit no more IDs than that, however many Initials a spoofer
// has the server answer there. The rest, the tag and the quick-reject
// bits below the set's, are the top bits of the hash of the ID and the
// address together.
func BoundHash(hk *sketch.HashKey, id ServerID, pk *PeerKey) uint64 {
	a := hk.LearnID[1+len(pk)]
	for i, w := range pk {
		a += hk.LearnID[1+i] * uint64(w)
	}
	h := hk.LearnID[0]*uint64(id.Word()) + a
	return a&^(1<<(64-LearnedSetShift)-1) | h>>LearnedSetShift
}

// PeerHash is the hash of address pk: its key in the sets of peers
// (peer_hash in learned.h).
func PeerHash(hk *sketch.HashKey, pk *PeerKey) uint64 {
	h := hk.LearnAddr[len(pk)]
	for i, w := range pk {
		h += hk.LearnAddr[i] * uint64(w)
	}
	return h
}

// LearnedSet is one learned set: its slots and its quick-reject filter,
// held in Go's memory (the Go twin) or in the kernel's maps, mapped
// (package kernel). Its methods are safe for concurrent use: every write is
// a compare-and-swap, as the program's are.
type LearnedSet struct {
	slots []uint64
	quick []uint64
}

// NewLearnedSet returns an empty learned set in Go's memory.
func NewLearnedSet() *LearnedSet {
	return &LearnedSet{slots: make([]uint64, LearnedSlots), quick: make([]uint64, QuickWords)}
}

// LearnedSetOn returns the learned set whose slots and quick-reject filter
// are the given memory (a kernel map's, mapped), which must outlive it.
func LearnedSetOn(slots, quick []uint64) (*LearnedSet, error) {
	if len(slots) != LearnedSlots || len(quick) != QuickWords {
		return nil, fmt.Errorf("a learned set has %d slots and a filter of %d words, got %d and %d",
			LearnedSlots, QuickWords, len(slots), len(quick))
	}
	return &LearnedSet{slots: slots, quick: quick}, nil
}

// setFirst is the index of the first slot of the set of a key of hash h.
func setFirst(h uint64) int { return int(h>>(64-LearnedSetShift)) * LearnedWays }

// slotKey is what a slot holding the key of hash h has in SlotKeyMask's
// bits (slot_key in learned.h).
func slotKey(h uint64) uint64 { return h<<LearnedSetShift>>(64-TagBits)<<TagShift | SlotUsed }

// quickBit is the bit of hash h in a quick-reject filter: its word and its
// mask.
func quickBit(h uint64) (int, uint64) {
	b := h >> (64 - QuickShift)
	return int(b / 64), 1 << (b % 64)
}

// MaybeIn consults the quick-reject filter for a member's hash h: false
// means that no member has h (maybe_in in learned.h).
func (s *LearnedSet) MaybeIn(h uint64) bool {
	i, m := quickBit(h)
	return atomic.LoadUint64(&s.quick[i])&m != 0
}

// Find returns the slot of the key of hash h, or -1 when the set does not
// hold it: the quick-reject filter first, then the key's set (maybe_in and
// find_slot in learned.h).
func (s *LearnedSet) Find(h uint64) int {
	if !s.MaybeIn(h) {
		return -1
	}
	key, first := slotKey(h), setFirst(h)
	for i := first; i < first+LearnedWays; i++ {
		if atomic.LoadUint64(&s.slots[i])&SlotKeyMask == key {
			return i
		}
	}
	return -1
}

// Slot returns slot i.
func (s *LearnedSet) Slot(i int) uint64 { return atomic.LoadUint64(&s.slots[i]) }

// Refresh moves the stamp of slot i, which held e when it was found, on to
// st when it is behind: at most one write per key and stamp. The
// compare-and-swap leaves alone a slot that another writer gave to another
// key, or stamped, since it was read (refresh_slot in learned.h).
func (s *LearnedSet) Refresh(i int, e uint64, st uint32) {
	if age := StampAge(st, e); age != 0 && age < halfStamps {
		atomic.CompareAndSwapUint64(&s.slots[i], e, e&^StampMask|uint64(st))
	}
}

// Mark sets SlotMark in slot i, which held e: false when the slot changed
// meanwhile (mark_slot in learned.h).
func (s *LearnedSet) Mark(i int, e uint64) bool {
	return atomic.CompareAndSwapUint64(&s.slots[i], e, e|SlotMark)
}

// Learn puts the key of hash h in the set at stamp st: into its own slot if
// it has one (its stamp moved on), else into the set's first empty slot,
// else into the slot of the set's stalest key, and sets its bit in the
// quick-reject filter. It reports false when other writers kept changing
// the set (learn_slot in learned.h, which tries once).
func (s *LearnedSet) Learn(h uint64, st uint32) bool {
	_, _, ok := s.learnAt(h, st)
	return ok
}

// learnAt is Learn, which also returns the key's slot (-1 when its own
// slot was stamped st or later already, or when it failed) and whether the
// slot held another key or none before.
func (s *LearnedSet) learnAt(h uint64, st uint32) (int, bool, bool) {
	for range learnTries {
		i, e := s.victim(h, st)
		if i < 0 {
			return -1, false, true // its own slot, stamped since
		}
		next := slotKey(h) | uint64(st)
		own := e&SlotKeyMask == slotKey(h)
		if own {
			next |= e & SlotMark
		}
		if atomic.CompareAndSwapUint64(&s.slots[i], e, next) {
			s.setQuick(h)
			return i, !own, true
		}
	}
	return -1, false, false
}

// victim is the slot Learn writes the key of hash h into at stamp st, and
// what it holds; -1 when the key's own slot is stamped st or later
// already.
func (s *LearnedSet) victim(h uint64, st uint32) (int, uint64) {
	key, first := slotKey(h), setFirst(h)
	victim, old, oldAge := -1, uint64(0), uint32(0)
	for i := first; i < first+LearnedWays; i++ {
		e := atomic.LoadUint64(&s.slots[i])
		if e&SlotKeyMask == key {
			if age := StampAge(st, e); age == 0 || age >= halfStamps {
				return -1, e
			}
			return i, e
		}
		switch age := StampAge(st, e); {
		case e&SlotUsed == 0:
			if victim < 0 || old&SlotUsed != 0 {
				victim, old, oldAge = i, e, 0
			}
		case age >= halfStamps: // from the future: the freshest
		case victim < 0 || old&SlotUsed != 0 && age > oldAge:
			victim, old, oldAge = i, e, age
		}
	}
	if victim < 0 { // every slot's stamp is from the future
		victim, old = first, atomic.LoadUint64(&s.slots[first])
	}
	return victim, old
}

// Touch moves the stamp of the key of hash h on to st when the set holds
// it, and adds nothing: how the learner keeps a proven peer it sends to.
func (s *LearnedSet) Touch(h uint64, st uint32) {
	if i := s.Find(h); i >= 0 {
		s.Refresh(i, s.Slot(i), st)
	}
}

// setQuick sets the bit of hash h in the quick-reject filter.
func (s *LearnedSet) setQuick(h uint64) {
	i, m := quickBit(h)
	atomic.OrUint64(&s.quick[i], m)
}

// Expire clears the slots whose key's stamp is more than lifetime stamps
// before st, and returns how many; then it rebuilds the quick-reject
// filter from the keys that remain (a slot holds its key's set and tag,
// the top bits of its hash, which the filter's bit is). A slot stamped
// between the read and the clear keeps its key (the compare-and-swap
// fails); a key learned while the filter is rebuilt keeps its bit, unless
// its bit was set when the rebuild began and its slot was read before it
// was written (it is found again when it is next learned).
func (s *LearnedSet) Expire(st, lifetime uint32) int {
	snap := make([]uint64, QuickWords)
	for i := range snap {
		snap[i] = atomic.LoadUint64(&s.quick[i])
	}
	next := make([]uint64, QuickWords)
	n := 0
	for i := range s.slots {
		e := atomic.LoadUint64(&s.slots[i])
		if e&SlotUsed == 0 {
			continue
		}
		if age := StampAge(st, e); age > lifetime && age < halfStamps && atomic.CompareAndSwapUint64(&s.slots[i], e, 0) {
			n++
			continue
		}
		w, m := quickBit(slotHash(i, e))
		next[w] |= m
	}
	if n == 0 {
		return 0
	}
	for i := range next {
		for {
			old := atomic.LoadUint64(&s.quick[i])
			if atomic.CompareAndSwapUint64(&s.quick[i], old, next[i]|old&^snap[i]) {
				break
			}
		}
	}
	return n
}

// slotHash is the top bits of the hash of the key in slot i, which holds
// e: its set and its tag.
func slotHash(i int, e uint64) uint64 {
	return uint64(i/LearnedWays)<<(64-LearnedSetShift) | e>>TagShift<<(64-LearnedSetShift-TagBits)
}

// Len counts the keys of the set.
func (s *LearnedSet) Len() int {
	n := 0
	for i := range s.slots {
		if atomic.LoadUint64(&s.slots[i])&SlotUsed != 0 {
			n++
		}
	}
	return n
}

// Snapshot returns a copy of the slots and of the quick-reject filter; for
// tests that compare the kernel's sets with the Go twin's.
func (s *LearnedSet) Snapshot() (slots, quick []uint64) {
	slots, quick = make([]uint64, len(s.slots)), make([]uint64, len(s.quick))
	for i := range s.slots {
		slots[i] = atomic.LoadUint64(&s.slots[i])
	}
	for i := range s.quick {
		quick[i] = atomic.LoadUint64(&s.quick[i])
	}
	return slots, quick
}

// CopyFrom sets s to o's keys and filter, each key stamped st: a new
// engine takes over what the one before it learned, on its own clock.
func (s *LearnedSet) CopyFrom(o *LearnedSet, st uint32) {
	slots, quick := o.Snapshot()
	for i, e := range slots {
		if e&SlotUsed != 0 {
			e = e&^StampMask | uint64(st)
		}
		atomic.StoreUint64(&s.slots[i], e)
	}
	for i, w := range quick {
		atomic.StoreUint64(&s.quick[i], w)
	}
}

// The answered peers' credits. Beside each slot of the answered set is a
// counter of the datagrams the address in it may still send verified by its
// credit (quicclass.FromAnswered, OpeningFromAnswered): the learner grants
// CreditPerDatagram for each datagram the server sends the address that
// holds a short-header packet (not a path probe, not a stateless reset; see
// package learn), up to CreditMax, and the filter spends one for each
// datagram it verifies so. A client that the server talks to sends at most
// about as many datagrams as it receives (an upload's acknowledgements are
// one for two of its packets), so it never runs out; an address a spoofer
// names gets what the server sends it, which it cannot receive: what a
// spoofed Initial's answer grants, and what quic-go may send to an address
// it has not validated, at most three times what it receives from it
// (RFC 9000 section 8.1), so a spoofer pays for credit with datagrams of
// its own that the filter let through first.
const (
	// CreditPerDatagram is what one of the server's datagrams grants: an
	// upload's acknowledgements (one for two of the client's packets, each
	// of which lets it send two more while its window grows) grant four
	// credits for each packet they acknowledge, twice what it sends.
	CreditPerDatagram = 64 // C: CREDIT_PER_DATAGRAM
	// CreditFirst is what a new answered peer starts with: a client's
	// first burst after its handshake, before the server's answers to it
	// grant more (quic-go's initial congestion window is 32 packets).
	CreditFirst = 32
	// CreditMax bounds an address's credit.
	CreditMax = 1 << 16 // C: CREDIT_MAX
)

// Credit holds the answered peers' credits, a counter beside each slot of
// the answered set (answered_credit in the C program), in Go's memory or
// in a kernel map's, mapped. Its methods are safe for concurrent use.
type Credit struct {
	c []uint32
}

// NewCredit returns credits for an answered set in Go's memory, all zero.
func NewCredit() *Credit { return &Credit{c: make([]uint32, LearnedSlots)} }

// CreditOn returns the credits whose counters are the given memory (a
// kernel map's, mapped), which must outlive them.
func CreditOn(mem []uint32) (*Credit, error) {
	if len(mem) != LearnedSlots {
		return nil, fmt.Errorf("the credits of a learned set are %d counters, got %d", LearnedSlots, len(mem))
	}
	return &Credit{c: mem}, nil
}

// Spend takes one credit of slot i: false when it has none (spend_credit in
// learned.h, which tries once too: a counter another writer changed since
// it was read is not spent, and the datagram is not verified by it).
func (c *Credit) Spend(i int) bool {
	v := atomic.LoadUint32(&c.c[i])
	return v != 0 && atomic.CompareAndSwapUint32(&c.c[i], v, v-1)
}

// Grant adds n credits to slot i, up to CreditMax.
func (c *Credit) Grant(i int, n uint32) {
	for {
		v := atomic.LoadUint32(&c.c[i])
		if v >= CreditMax || atomic.CompareAndSwapUint32(&c.c[i], v, min(v+min(n, CreditMax), CreditMax)) {
			return
		}
	}
}

// Of returns slot i's credit.
func (c *Credit) Of(i int) uint32 { return atomic.LoadUint32(&c.c[i]) }

// reset sets slot i's credit to CreditFirst: a new key took the slot.
func (c *Credit) reset(i int) { atomic.StoreUint32(&c.c[i], CreditFirst) }

// Snapshot returns a copy of the counters; for tests that compare the
// kernel's credits with the Go twin's.
func (c *Credit) Snapshot() []uint32 {
	out := make([]uint32, len(c.c))
	for i := range c.c {
		out[i] = atomic.LoadUint32(&c.c[i])
	}
	return out
}

// copyFrom sets c to o's counters.
func (c *Credit) copyFrom(o *Credit) {
	for i := range c.c {
		atomic.StoreUint32(&c.c[i], atomic.LoadUint32(&o.c[i]))
	}
}

// Learned are a filter's three learned sets and the answered peers'
// credits.
type Learned struct {
	// IDs are the server IDs, each bound to the address it was sent to.
	IDs *LearnedSet
	// Proven are the peers that proved their address.
	Proven *LearnedSet
	// Answered are the addresses the server sent a connection's packets
	// to.
	Answered *LearnedSet
	// Credit is the answered peers' credits, slot by slot of Answered.
	Credit *Credit
}

// NewLearned returns three empty learned sets in Go's memory.
func NewLearned() Learned {
	return Learned{IDs: NewLearnedSet(), Proven: NewLearnedSet(), Answered: NewLearnedSet(), Credit: NewCredit()}
}

// Sets lists the sets, indexed as the C program indexes them (LearnedIDs,
// LearnedProven, LearnedAnswered).
func (l Learned) Sets() [NumLearned]*LearnedSet {
	return [NumLearned]*LearnedSet{LearnedIDs: l.IDs, LearnedProven: l.Proven, LearnedAnswered: l.Answered}
}

// LearnServerID binds id, a connection ID the server put in a long
// header's source connection ID, to addr, the address the server sent it
// to, at time now (nanoseconds, monotonic); hk is the filter's hash key.
func (l Learned) LearnServerID(hk *sketch.HashKey, id ServerID, addr netip.Addr, now int64) error {
	pk, err := PeerKeyOf(addr)
	if err != nil {
		return err
	}
	if !l.IDs.Learn(BoundHash(hk, id, &pk), Stamp(now)) {
		return fmt.Errorf("learning server connection ID %x for %v: its set kept changing over %d tries", id[:], addr, learnTries)
	}
	return nil
}

// LearnPeer records that the server sent a connection's packet to addr at
// time now: addr is an answered peer from now on (a new one with
// CreditFirst), and, if it proved its address, stays a proven one. Only the
// filter proves an address (Filter.Decide): what the server sends shows
// whom it answers, not who receives it.
func (l Learned) LearnPeer(hk *sketch.HashKey, addr netip.Addr, now int64) error {
	pk, err := PeerKeyOf(addr)
	if err != nil {
		return err
	}
	h, st := PeerHash(hk, &pk), Stamp(now)
	l.Proven.Touch(h, st)
	i, fresh, ok := l.Answered.learnAt(h, st)
	if !ok {
		return fmt.Errorf("learning peer %v: its set kept changing over %d tries", addr, learnTries)
	}
	if fresh {
		l.Credit.reset(i)
	}
	return nil
}

// Grant adds credits to addr, an answered peer (see CreditPerDatagram);
// nothing when addr is not one.
func (l Learned) Grant(hk *sketch.HashKey, addr netip.Addr, credits int) error {
	pk, err := PeerKeyOf(addr)
	if err != nil {
		return err
	}
	if i := l.Answered.Find(PeerHash(hk, &pk)); i >= 0 && credits > 0 {
		l.Credit.Grant(i, uint32(min(credits, CreditMax)))
	}
	return nil
}

// Expire forgets the keys of each set neither learned nor used for
// lifetime stamps before now's, and returns how many of each.
func (l Learned) Expire(now int64, lifetime uint32) (counts [NumLearned]int) {
	st := Stamp(now)
	for i, s := range l.Sets() {
		counts[i] = s.Expire(st, lifetime)
	}
	return counts
}

// CopyFrom sets l's sets and credits to o's, each key stamped st. The
// slots are copied as they are: both filters must hash with one key.
func (l Learned) CopyFrom(o Learned, st uint32) {
	l.IDs.CopyFrom(o.IDs, st)
	l.Proven.CopyFrom(o.Proven, st)
	l.Answered.CopyFrom(o.Answered, st)
	l.Credit.copyFrom(o.Credit)
}

// LifetimeStamps is a lifetime in nanoseconds as a number of stamps,
// rounded up: a key is expired once it is more than that many stamps old.
func LifetimeStamps(ns int64) uint32 {
	return uint32(min((max(ns, 0)+1<<StampShift-1)>>StampShift, halfStamps-1))
}
