package userspace

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The returning users' sources the limiter remembers for the pre-filter
// (prefilter.Spec.Returning): at most MaxReturning, each for ReturningTTL
// after its last datagram verified through its address.
const (
	MaxReturning = 1024
	ReturningTTL = 30 * time.Second
	// returningSample: one in 2^returningSample of the trusted datagrams
	// that are not openings is noted (a kept connection's hundreds a
	// second note its source within a second or two); every returning
	// user's opening is.
	returningSample = 6
)

// returningKey is a source address as the limiter's keys hold it.
type returningKey struct {
	family sketch.Family
	words  [4]uint32
}

// trusted reports whether a datagram so verified came from a source that
// receives what the server sends it: by a server ID bound to it, or as a
// proven peer's. Not on an answered peer's credit, which a spoofer earns
// for an address it names: such sources would fill the list.
func trusted(v quicclass.Verification) bool {
	switch v {
	case quicclass.ShortByID, quicclass.OpeningByID, quicclass.ShortByPeer, quicclass.OpeningFromPeer,
		quicclass.HandshakeFromPeer:
		return true
	}
	return false
}

// noteReturning remembers the source of k, whose datagram out decided at
// now, when it was trusted: every returning user's opening, and a sample of
// the rest, by bits of rnd the tracking sample (the low bits) does not
// use. l.mu must be held.
func (l *Decider) noteReturning(k *sketch.Key, out *decide.Outcome, now int64, rnd uint32) {
	if !trusted(out.Verified) {
		return
	}
	if !out.Verified.Returning() && (rnd>>16)&(1<<returningSample-1) != 0 {
		return
	}
	rk := returningKey{family: k.Family, words: k.Words}
	if _, ok := l.returning[rk]; !ok && len(l.returning) >= MaxReturning {
		// Full: the source seen longest ago makes room, so that a list
		// filled once keeps the latest.
		oldest, at := rk, now
		for k, t := range l.returning {
			if t < at {
				oldest, at = k, t
			}
		}
		delete(l.returning, oldest)
	}
	l.returning[rk] = now
}

// Returning lists the sources of the returning users seen within
// ReturningTTL, the most recent first, and forgets the older ones.
func (l *Decider) Returning() []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.now()
	type seen struct {
		addr netip.Addr
		at   int64
	}
	var all []seen
	for rk, at := range l.returning {
		if now-at > ReturningTTL.Nanoseconds() {
			delete(l.returning, rk)
			continue
		}
		k := sketch.Key{Family: rk.family, Words: rk.words}
		all = append(all, seen{k.Addr(), at})
	}
	slices.SortFunc(all, func(a, b seen) int {
		return cmp.Or(cmp.Compare(b.at, a.at), a.addr.Compare(b.addr))
	})
	out := make([]netip.Addr, len(all))
	for i, s := range all {
		out[i] = s.addr
	}
	return out
}
