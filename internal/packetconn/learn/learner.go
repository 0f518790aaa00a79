package learn

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// Sink is what a Learner teaches: the engine that verifies the datagrams
// clients send (the kernel filter or the userspace limiter). Its methods
// must be safe for concurrent use.
type Sink interface {
	// LearnServerID records id, a connection ID the server chose and put
	// in the source connection ID of a long-header packet it sends, bound
	// to to, the address it sends it to (an IPv4 address unmapped,
	// without a zone): only to proves itself with it.
	LearnServerID(id ServerID, to netip.Addr) error
	// LearnPeer records addr, an address the server sends a connection's
	// datagrams to (an IPv4 address unmapped, without a zone): an answered
	// peer.
	LearnPeer(addr netip.Addr) error
	// Grant adds credits to addr, an answered peer: what addr may send
	// verified by its credit (decide.Credit), earned by the server's
	// datagrams to it (see Learner.Learn). Called for every write, after
	// LearnPeer taught addr; it must be cheap.
	Grant(addr netip.Addr, credits int) error
}

// Defaults and bounds of a Learner.
const (
	// DefaultLifetime is the default Options.Lifetime: a bit more than
	// quic-go's default idle timeout of 30 s.
	DefaultLifetime = 40 * time.Second
	// PeerInterval is how often at most a Learner reports one peer, while
	// the server keeps sending to it.
	PeerInterval = time.Second
	// MaxIDs and MaxPeers bound the server IDs and the peers a Learner
	// remembers (see the package doc for the memory).
	MaxIDs   = 1 << 16
	MaxPeers = 1 << 16

	// shardBits sets the number of shards of each table: writers to
	// different peers rarely wait for each other.
	shardBits = 4
	numShards = 1 << shardBits
	// idsPerShard and peersPerShard are each shard's share of the bounds.
	idsPerShard   = MaxIDs / numShards
	peersPerShard = MaxPeers / numShards
)

// Options configure a Learner.
type Options struct {
	// Lifetime is how long the engine keeps a server ID or a peer it was
	// taught and that is not used (its ExpireLearned lifetime): the
	// Learner reports a server ID again when it is sent again more than a
	// quarter of Lifetime after its last report, and remembers it for
	// Lifetime after it was last sent, to teach it to a new sink
	// (SetSink). Zero means DefaultLifetime; it must be at least
	// PeerInterval.
	Lifetime time.Duration
	// OnOddID, if not nil, is called once, from the write path, the
	// first time the server sends a Handshake or Retry packet whose source
	// connection ID is not ServerIDLen bytes long (its length is the
	// argument). Verification by server ID cannot work with such IDs (a
	// connection ID generator other than quic-go's default): the caller
	// turns it off and logs. Counts counts every such packet.
	OnOddID func(length int)
}

// Counts are a Learner's counters since it was made.
type Counts struct {
	// IDs counts server IDs reported to a sink that accepted them: new
	// ones, refreshes and those taught again to a new sink.
	IDs uint64
	// Peers counts peer reports a sink accepted.
	Peers uint64
	// Grants counts the credits a sink granted (see Learner.Learn).
	Grants uint64
	// Errors counts reports a sink refused.
	Errors uint64
	// OddIDs counts the server's Handshake and Retry packets whose source
	// connection ID is not ServerIDLen bytes long.
	OddIDs uint64
	// Overflows counts the times a full shard of the server IDs or of the
	// peers was emptied to make room (each entry forgotten is reported
	// again when next sent, or not taught to a new sink).
	Overflows uint64
}

// Learner reads the datagrams the server sends and teaches a Sink the
// server's connection IDs and the addresses of its peers (see the package
// doc). It is safe for concurrent use.
type Learner struct {
	sink atomic.Pointer[sinkBox]
	// setMu serialises SetSink.
	setMu sync.Mutex
	// lifetime and refresh are in nanoseconds of now.
	lifetime, refresh int64
	onOdd             func(int)
	oddCalled         atomic.Bool
	// now is a monotonic clock in nanoseconds.
	now func() int64
	// seed keys the shard hash.
	seed uint64

	ids   [numShards]shard[boundID, entry]
	peers [numShards]shard[[16]byte, peerEntry]

	nIDs, nPeers, nGrants, nErrors, nOdd, nOverflows atomic.Uint64
}

// boundID is a server ID with the address it was sent to (its 16 bytes,
// an IPv4 address mapped: smaller than a netip.Addr).
type boundID struct {
	id ServerID
	to [16]byte
}

// addr is the address b's ID was sent to.
func (b boundID) addr() netip.Addr { return netip.AddrFrom16(b.to).Unmap() }

// sinkBox holds a Sink for an atomic pointer.
type sinkBox struct{ Sink }

// entry is what a table remembers of a key, in nanoseconds of the
// Learner's clock: when it was last reported to a sink and last sent.
type entry struct {
	reported, seen int64
}

// sentAt is when the server last sent the key.
func (e entry) sentAt() int64 { return e.seen }

// recentHandshakes is how many destination IDs of the server's latest
// long headers to a peer its entry keeps.
const recentHandshakes = 4

// peerEntry is what the peers' table remembers of an address: an entry,
// and the destination IDs (cidHash) of the server's latest long headers to
// it, in a ring: its clients' own IDs in their handshakes (see grants).
type peerEntry struct {
	entry
	handshakes [recentHandshakes]uint32
	next       uint8
}

// addHandshake records the destination ID hash h of one of the server's
// long headers to the peer, in place of the oldest.
func (e *peerEntry) addHandshake(h uint32) {
	if !slices.Contains(e.handshakes[:], h) {
		e.handshakes[e.next%recentHandshakes] = h
		e.next++
	}
}

// inHandshake reports whether the short header d goes to a destination ID
// of the server's latest long headers to the peer: the length of a short
// header's ID is not on the wire, so d is read at the length of each.
func (e *peerEntry) inHandshake(d []byte) bool {
	for _, h := range e.handshakes {
		if n := int(h >> 24); h != 0 && 1+n <= len(d) && cidHash(d[1:1+n]) == h {
			return true
		}
	}
	return false
}

// shard is a part of a table, with its own lock, on a cache line of its
// own.
type shard[K comparable, V interface{ sentAt() int64 }] struct {
	mu sync.Mutex
	m  map[K]V
	_  cpu.CacheLinePad
}

// NewLearner returns a Learner that teaches sink (nil: nothing until
// SetSink).
func NewLearner(sink Sink, o Options) (*Learner, error) {
	start := time.Now()
	return newLearner(sink, o, func() int64 { return int64(time.Since(start)) })
}

// newLearner returns a Learner on the clock now.
func newLearner(sink Sink, o Options, now func() int64) (*Learner, error) {
	if o.Lifetime == 0 {
		o.Lifetime = DefaultLifetime
	}
	if o.Lifetime < PeerInterval {
		return nil, fmt.Errorf("learner: lifetime %v is shorter than the peer interval %v", o.Lifetime, PeerInterval)
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("learner: seeding the shard hash: %w", err)
	}
	l := &Learner{
		lifetime: int64(o.Lifetime),
		refresh:  int64(o.Lifetime / 4),
		onOdd:    o.OnOddID,
		now:      now,
		seed:     binary.LittleEndian.Uint64(seed[:]) | 1,
	}
	if sink != nil {
		l.sink.Store(&sinkBox{sink})
	}
	return l, nil
}

// Counts returns the Learner's counters.
func (l *Learner) Counts() Counts {
	return Counts{
		IDs:       l.nIDs.Load(),
		Peers:     l.nPeers.Load(),
		Grants:    l.nGrants.Load(),
		Errors:    l.nErrors.Load(),
		OddIDs:    l.nOdd.Load(),
		Overflows: l.nOverflows.Load(),
	}
}

// SetSink makes s the sink from now on (nil: learn nothing); once it
// returns, no report is still being made to the old sink. A new sink
// knows nothing: it is taught at once every server ID sent within the
// lifetime (quic-go sends a connection's ID only in its handshake, so it
// would not be seen again), and every peer again at the next datagram to
// it.
func (l *Learner) SetSink(s Sink) {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	var box *sinkBox
	if s != nil {
		box = &sinkBox{s}
	}
	l.sink.Store(box)
	for i := range l.peers {
		sh := &l.peers[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
	if box == nil {
		// A report in flight holds its shard's lock: once every lock has
		// been taken, none is still calling the old sink, which the
		// caller may then close.
		for i := range l.ids {
			l.ids[i].mu.Lock()
			l.ids[i].mu.Unlock()
		}
		return
	}
	now := l.now()
	for i := range l.ids {
		l.replay(&l.ids[i], now)
	}
}

// replay teaches the current sink the server IDs of sh sent within the
// lifetime, and forgets the others.
func (l *Learner) replay(sh *shard[boundID, entry], now int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	box := l.sink.Load() // under the lock: see learnID
	for k, e := range sh.m {
		if now-e.seen >= l.lifetime {
			delete(sh.m, k)
			continue
		}
		if box != nil && l.report(box.LearnServerID(k.id, k.addr()), &l.nIDs) {
			e.reported = now
			sh.m[k] = e
		}
	}
}

// Learn reads the datagram b the server is about to send to to, with its
// control messages oob (a GSO batch of several datagrams when oob holds a
// UDP_SEGMENT message), and teaches the sink what it has not been taught
// yet, before it returns: call it before the datagram is written, so that
// the engine knows an ID before a client can answer with it. It allocates
// nothing, and for a short-header datagram takes one map lookup under a
// shard's lock and a grant.
//
// What a datagram teaches is inspect's: the server IDs of a connection's
// Handshake packets (and of its ServerHello's Initial), each bound to to's
// address, and to's address as a peer when the datagram belongs to a
// connection. Each datagram that holds a short-header packet also grants
// to's address credit (Sink.Grant, see grants).
func (l *Learner) Learn(b, oob []byte, to netip.AddrPort) {
	if l == nil || len(b) == 0 || !to.IsValid() || l.sink.Load() == nil {
		return
	}
	seg := len(b)
	gso := false
	if s := segmentSize(oob); s > 0 {
		seg, gso = s, true
	}
	addr := to.Addr().Unmap().WithZone("")
	now := l.now()
	var p peerSeen
	for off := 0; off < len(b); off += seg {
		d := b[off:min(off+seg, len(b))]
		if d[0]&headerForm == 0 { // a short header: no need to inspect
			p.short(d, gso)
			continue
		}
		s := inspect(d)
		p.peer = p.peer || s.peer
		if s.short {
			p.handshake++
		}
		for _, h := range s.dcids[:s.nDCIDs] {
			p.addDCID(h)
		}
		for _, id := range s.ids[:s.nIDs] {
			l.learnID(boundID{id: id, to: addr.As16()}, now)
		}
		if s.odd > 0 {
			l.nOdd.Add(uint64(s.odd))
			if l.onOdd != nil && l.oddCalled.CompareAndSwap(false, true) {
				l.onOdd(oddLen(d))
			}
		}
	}
	if p.peer || p.shaped > 0 {
		l.learnPeer(addr, now, &p)
	}
}

// Shapes of quic-go's stateless replies to a datagram of an address's own
// that are short headers: a path probe (PATH_CHALLENGE or PATH_RESPONSE,
// padded to 1200 bytes and written alone), which quic-go sends to any new
// address a connection's 1-RTT packet comes from, validated or not; and a
// stateless reset (42 bytes), when a reset key is set (Caddy sets none).
// A spoofer that has one of its own connection's packets sent from an
// address it does not receive at gets one of these there.
const (
	probeSize = quicclass.MinInitialDatagram
	resetSize = 42
)

// peerSeen is what one write shows of its destination: whether it belongs
// to a connection, the datagrams that grant credit by kind (see grants),
// the destination IDs of its long headers (cidHash), and its first lone
// short-header datagram.
type peerSeen struct {
	peer bool
	// replies are lone short-header datagrams, handshake those coalesced
	// after long headers, shaped those shaped as a stateless reply.
	replies, handshake, shaped int
	dcids                      [maxIDsPerDatagram]uint32
	nDCIDs                     int
	first                      []byte
}

// short records the short-header datagram d, written in a GSO batch or
// alone (gso). One shaped as a stateless reply makes no peer: quic-go sends
// it to an address that never received anything.
func (p *peerSeen) short(d []byte, gso bool) {
	if d[0]&fixedBit == 0 {
		return
	}
	switch {
	case len(d) == resetSize || !gso && len(d) == probeSize:
		p.shaped++
	default:
		p.peer = true
		p.replies++
		if p.first == nil {
			p.first = d
		}
	}
}

// addDCID records the destination ID hash h of a long header.
func (p *peerSeen) addDCID(h uint32) {
	if p.nDCIDs < len(p.dcids) && !slices.Contains(p.dcids[:p.nDCIDs], h) {
		p.dcids[p.nDCIDs] = h
		p.nDCIDs++
	}
}

// oddLen returns the length of the first source connection ID of the
// datagram d that inspect counts as odd.
func oddLen(d []byte) int {
	for len(d) > 0 && d[0]&headerForm != 0 {
		size, typ, scid, ok := parseLong(d)
		if !ok {
			break
		}
		if len(scid) != ServerIDLen && typ != typeInitial {
			return len(scid)
		}
		d = d[size:]
	}
	return -1
}

// learnID teaches the sink k unless it was taught less than the refresh
// interval ago, and records that k's ID was sent to k's address at now.
func (l *Learner) learnID(k boundID, now int64) {
	sh := &l.ids[l.shardOf(uint64(binary.LittleEndian.Uint32(k.id[:]))^binary.LittleEndian.Uint64(k.to[:8]),
		binary.LittleEndian.Uint64(k.to[8:]))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// The sink is read under the lock, which SetSink takes after storing a
	// new one: an ID recorded here is either reported to the new sink or
	// replayed to it.
	box := l.sink.Load()
	if box == nil {
		return
	}
	e, ok := sh.m[k]
	if !ok {
		sh.m = makeRoom(sh.m, now, l.lifetime, idsPerShard, &l.nOverflows)
		e.reported = now - l.refresh // never reported
	}
	e.seen = now
	if now-e.reported >= l.refresh && l.report(box.LearnServerID(k.id, k.addr()), &l.nIDs) {
		// A refused ID is reported again with the next packet that
		// carries it.
		e.reported = now
	}
	sh.m[k] = e
}

// learnPeer teaches the sink addr when p shows a connection's datagram,
// unless it was taught less than PeerInterval ago, and grants it what p
// earns (grants; the sink grants nothing to an address it does not know as
// a peer). The sink is called under the shard's lock: a concurrent write to
// the same peer waits until the sink knows it, and its credit.
func (l *Learner) learnPeer(addr netip.Addr, now int64, p *peerSeen) {
	key := addr.As16()
	sh := &l.peers[l.shardOf(binary.LittleEndian.Uint64(key[:8]), binary.LittleEndian.Uint64(key[8:]))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	box := l.sink.Load()
	if box == nil {
		return
	}
	e, ok := sh.m[key]
	if p.peer {
		if !ok {
			sh.m = makeRoom(sh.m, now, int64(PeerInterval), peersPerShard, &l.nOverflows)
			e.reported = now - int64(PeerInterval) // never reported
		}
		e.seen = now
		for _, h := range p.dcids[:p.nDCIDs] {
			e.addHandshake(h)
		}
		// A refused peer is reported again after PeerInterval, as an
		// accepted one: a failing sink is not called for every datagram.
		if now-e.reported >= int64(PeerInterval) {
			e.reported = now
			l.report(box.LearnPeer(addr), &l.nPeers)
		}
		sh.m[key] = e
	}
	if credit := grants(&e, p); credit > 0 {
		if err := box.Grant(addr, credit); err != nil {
			l.nErrors.Add(1)
		} else {
			l.nGrants.Add(uint64(credit))
		}
	}
}

// grants is the credit a write to a peer whose entry is e earns, by its
// datagrams that hold a short-header packet (p): decide.CreditPerDatagram
// for each lone one, an established connection's (an upload's
// acknowledgements, written one for tens of the client's packets when the
// server reads them in batches); CreditInHandshake for each one
// coalesced after long headers, or to a destination ID of the server's
// latest long headers to the peer: a handshake's 0.5-RTT data, which the
// answer to a spoofed Initial holds too; and one for each shaped as a
// stateless reply (a path probe, a stateless reset), which pays back the
// datagram that asked for it, so that a spoofer gains nothing by it (a
// connection's datagrams of those sizes grant one too).
func grants(e *peerEntry, p *peerSeen) int {
	perReply := decide.CreditPerDatagram
	if p.first != nil && e.inHandshake(p.first) {
		perReply = CreditInHandshake
	}
	return p.replies*perReply + p.handshake*CreditInHandshake + p.shaped
}

// CreditInHandshake is what a short-header datagram of a handshake under
// way grants (see grants).
const CreditInHandshake = 8

// report counts the result of a report to a sink, in ok if it was
// accepted, and says whether it was.
func (l *Learner) report(err error, ok *atomic.Uint64) bool {
	if err != nil {
		l.nErrors.Add(1)
		return false
	}
	ok.Add(1)
	return true
}

// makeRoom returns m (made if nil) with room for one more entry under
// limit: when m is full, it forgets the entries not sent for keep, and if
// that frees less than an eighth of m, all of them (so that a sweep, which
// walks the whole shard, happens at most once per limit/8 new entries),
// which it counts as an overflow.
func makeRoom[K comparable, V interface{ sentAt() int64 }](m map[K]V, now, keep int64, limit int, overflows *atomic.Uint64) map[K]V {
	if m == nil {
		return make(map[K]V)
	}
	if len(m) < limit {
		return m
	}
	for k, e := range m {
		if now-e.sentAt() >= keep {
			delete(m, k)
		}
	}
	if len(m) > limit-limit/8 {
		clear(m)
		overflows.Add(1)
	}
	return m
}

// shardOf returns the shard of a key whose bits are a and b.
func (l *Learner) shardOf(a, b uint64) int {
	// A multiplicative hash keyed by the seed: which keys share a shard
	// is not up to the clients.
	h := (a ^ l.seed) * 0x9e3779b97f4a7c15
	h = (h ^ b ^ h>>29) * 0xbf58476d1ce4e5b9
	return int(h >> (64 - shardBits))
}
