//go:build linux

package bench

import (
	"net/netip"
	"time"
)

// Scenario is one measured situation: a flood (or none) with the legitimate
// clients running, or the heavy transfers.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Flood is nil when nothing floods.
	Flood *FloodSpec `json:"flood,omitempty"`
	// Transfers marks the transfer scenario (no flood, no request clients).
	Transfers bool `json:"transfers,omitempty"`
	// Returning adds the returning client: it connects before the flood,
	// then opens new connections from the same address during it.
	Returning bool `json:"returning,omitempty"`
	// ReturningFrom, when valid, is the returning client's address, in
	// place of returningSrc.
	ReturningFrom netip.Addr `json:"returning_from,omitzero"`
	// ReturningKeeps keeps the returning client's first connection open
	// and makes requests over it during the flood, requestRate a second:
	// its established requests, beside its new connections.
	ReturningKeeps bool `json:"returning_keeps,omitempty"`
	// Timeline scrapes the module's opening total in force and the
	// opening class's verdicts every second of the flood (OpeningTimeline).
	Timeline bool `json:"timeline,omitempty"`
	// Stranger adds the stranger client: requestRate new connections a
	// second, each from the next address of strangerNet, so that each
	// connection's first Initial comes from an address the server never
	// answered (the new-connection client's address, once one of its
	// handshakes proved it, sends a returning user's Initials).
	Stranger bool `json:"stranger,omitempty"`
}

// returningAddr is the returning client's address.
func (s Scenario) returningAddr() netip.Addr {
	if s.ReturningFrom.IsValid() {
		return s.ReturningFrom
	}
	return returningSrc
}

// attack reports whether the scenario is an attack on verification: an
// attacker's own connection, a warm-up, proven bots or a returning client.
func (s Scenario) attack() bool {
	return s.Returning || s.Flood != nil && (s.Flood.Attacker.IsValid() || s.Flood.Warmup || s.Flood.Prove)
}

// FloodSpec says who floods and with what.
type FloodSpec struct {
	// Sources has one entry per socket: a repeated address is one
	// address on several source ports.
	Sources []netip.Addr `json:"-"`
	// Spoofed, when valid, adds a raw socket that sends every datagram
	// from a new random address in this range (inside 127.0.0.0/8) and a
	// new random port; the sockets of Sources, if any, take turns with it.
	Spoofed netip.Prefix `json:"spoofed,omitzero"`
	// SpoofedSet, when positive, narrows Spoofed to that many fixed
	// addresses spread over its /24s (setHosts); the port stays random.
	SpoofedSet int `json:"spoofed_set,omitempty"`
	// Warmup, with SpoofedSet, opens the flood with a real client's first
	// flight (clientFlights) from each address of the set in turn, at
	// warmupRate, for at most half the flood: quic-go answers each, which
	// makes the address one the server answers. The rest of the flood
	// comes from the addresses warmed only.
	Warmup bool `json:"warmup,omitempty"`
	// WarmupFlights is the number of first flights each address of the
	// set sends in the warm-up, each a connection of its own to which the
	// server binds an ID (0: one).
	WarmupFlights int `json:"warmup_flights,omitempty"`
	// SpoofedExcept, when valid, is an address of Spoofed that the
	// spoofed flood never sends from (a client's, inside the flooded
	// range).
	SpoofedExcept netip.Addr `json:"spoofed_except,omitzero"`
	// Rate, when positive, paces the flood at that many datagrams a
	// second, a warm-up apart; the addresses of a spoofed set then send
	// in turn, each Rate / SpoofedSet a second.
	Rate int `json:"rate,omitempty"`
	// Prove, with SpoofedSet, makes each address of the set a bot that
	// proves itself before the flood (proveBots): a real connection from
	// a socket bound to it, then one Handshake from it whose destination
	// ID is the server ID the server chose for that connection.
	Prove bool `json:"prove,omitempty"`
	// PathProbes, with an Attacker and a SpoofedSet, has the attacker's
	// connection add a path from each address of the set during the flood,
	// over a socket that never reads, and probe it every probeInterval:
	// quic-go answers each probe with a PATH_CHALLENGE to that address.
	PathProbes bool `json:"path_probes,omitempty"`
	// Attacker, when valid, is the source of the attacker's own HTTP/3
	// connection, opened before the flood and used during it; the kinds
	// that carry a server ID carry the one the server chose for it.
	Attacker netip.Addr `json:"attacker,omitzero"`
	Kind     PacketKind `json:"kind"`
	// On and Off make a pulsing flood: full rate for On, silence for Off.
	// Zero On: continuous.
	On  time.Duration `json:"on,omitempty"`
	Off time.Duration `json:"off,omitempty"`
}

// Address plan, all in 127.0.0.0/8 and away from 127.0.0.0/24 (where Caddy
// listens and gtlsclient connects from): the legitimate clients own
// 127.77.0.0/24, the 20-connection transfer 127.78.0.0/16, each flood its own
// range.
var (
	newConnSrc     = netip.AddrFrom4([4]byte{127, 77, 0, 1})
	establishedSrc = netip.AddrFrom4([4]byte{127, 77, 0, 2})
	returningSrc   = netip.AddrFrom4([4]byte{127, 77, 0, 3})
	probeSrc       = netip.AddrFrom4([4]byte{127, 77, 0, 250})
	transferSrc    = netip.AddrFrom4([4]byte{127, 77, 0, 10})
)

// spoofedNet is the source range of the spoofed floods: 127.128.0.0/9,
// 32,768 /24s, none of them the clients', the transfer's or Caddy's.
var spoofedNet = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 128, 0, 0}), 9)

// answeredNet is the range of answered-reuse's fixed set of spoofed
// sources, inside spoofedNet.
var answeredNet = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 129, 0, 0}), 16)

// answeredSet is the number of addresses of answered-reuse's spoofed set.
const answeredSet = 2000

// The ranges of the attacks on proofs, inside spoofedNet, one each: the
// victim of id-guess (127.130.0.1, the first host of its /24), the bots of
// proven-botnet (127.131.i.1, one per /24), the /24 of returning-flooded-24
// with its returning client, and borrowed-proof's victim (127.133.0.1).
var (
	guessNet         = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 130, 0, 0}), 24)
	botNet           = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 131, 0, 0}), 16)
	floodedNet       = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 132, 0, 0}), 24)
	floodedReturning = netip.AddrFrom4([4]byte{127, 132, 0, 3})
	borrowedNet      = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 133, 0, 0}), 24)
)

// Sizes and rates of the attacks on proofs.
const (
	// guessFlights is the number of first flights id-guess's victim is
	// warmed with: twice the IDs an address holds (decide.LearnedWays).
	guessFlights = 16
	// bots is the number of proven-botnet's bots, one per /24.
	bots = 60
	// botRate is each bot's Initials a second: under the per-address
	// limits (1,000), 54,000 in all, over the opening total (20,000 at
	// first).
	botRate = 900
)

// strangerNet is the stranger client's network: each connection from the
// next of its hosts, .1 to .254 in turn.
var strangerNet = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 76, 0, 0}), 24)

// strangerAddr returns the stranger client's address for its i-th
// connection (from 0).
func strangerAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 76, 0, byte(1 + i%254)}) }

// transferNet returns the source of the i-th connection of the 20-connection
// transfer: 127.78.i.1, one /24 each.
func transferNet(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 78, byte(i), 1}) }

// onePort is one address on n source ports.
func onePort(a netip.Addr, n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = a
	}
	return out
}

// carpet is every address of the /24 127.b.c.0/24.
func carpet(b, c byte) []netip.Addr {
	out := make([]netip.Addr, 256)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{127, b, c, byte(i)})
	}
	return out
}

// spread is 1024 addresses over 256 /24s: 127.b.x.1 to 127.b.x.4.
func spread(b byte) []netip.Addr {
	out := make([]netip.Addr, 0, 1024)
	for x := range 256 {
		for h := 1; h <= 4; h++ {
			out = append(out, netip.AddrFrom4([4]byte{127, b, byte(x), byte(h)}))
		}
	}
	return out
}

// Scenarios returns every scenario, in the order they run.
func Scenarios() []Scenario {
	a := func(b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{127, b, c, d}) }
	return []Scenario{
		{Name: "idle", Description: "no flood: the clients alone"},
		{Name: "one-source", Description: "one address, one port, Initial-like 1200-byte datagrams at full rate",
			Flood: &FloodSpec{Sources: []netip.Addr{a(66, 0, 1)}, Kind: PacketInitial}},
		{Name: "many-ports", Description: "one address over 1024 source ports, Initial-like, full rate",
			Flood: &FloodSpec{Sources: onePort(a(66, 1, 1), 1024), Kind: PacketInitial}},
		{Name: "carpet-24", Description: "all 256 addresses of one /24, Initial-like, full rate",
			Flood: &FloodSpec{Sources: carpet(66, 2), Kind: PacketInitial}},
		{Name: "spread-1024", Description: "1024 addresses over 256 /24s, Initial-like, full rate",
			Flood: &FloodSpec{Sources: spread(80), Kind: PacketInitial}},
		{Name: "invalid", Description: "QUIC junk from 1024 addresses over 256 /24s, in turn: unknown version (1200 B), " +
			"Initials under 1200 B, fixed bit 0, connection ID length over 20",
			Flood: &FloodSpec{Sources: spread(81), Kind: PacketInvalid}},
		{Name: "short-one", Description: "short-header junk (unknown connection IDs, 1200 B) from one address",
			Flood: &FloodSpec{Sources: []netip.Addr{a(66, 3, 1)}, Kind: PacketShort}},
		{Name: "short-1024", Description: "short-header junk from 1024 addresses over 256 /24s",
			Flood: &FloodSpec{Sources: spread(82), Kind: PacketShort}},
		{Name: "pulse", Description: "1024 addresses over 256 /24s, Initial-like, full rate for 0.5 s every 2 s",
			Flood: &FloodSpec{Sources: spread(83), Kind: PacketInitial, On: 500 * time.Millisecond, Off: 1500 * time.Millisecond}},
		{Name: "spoofed-initial", Description: "Initial-like 1200-byte datagrams, each from a new random address in 127.128.0.0/9 " +
			"and a new random port (a raw socket), full rate",
			Flood: &FloodSpec{Spoofed: spoofedNet, Kind: PacketInitial}},
		{Name: "spoofed-long-min", Description: "7-byte long headers (Handshake, version 1, empty connection IDs), " +
			"each from a new random address in 127.128.0.0/9 and port, full rate",
			Flood: &FloodSpec{Spoofed: spoofedNet, Kind: PacketLongMin}},
		{Name: "spoofed-short", Description: "short-header junk of 60 to 100 bytes, each from a new random address in 127.128.0.0/9 " +
			"and port, full rate",
			Flood: &FloodSpec{Spoofed: spoofedNet, Kind: PacketShortSmall}},
		{Name: "id-spray-spoofed", Description: "the attacker's own HTTP/3 connection from 127.67.0.1 (a request every 200 ms), " +
			"and short headers of 50 to 1200 bytes whose destination connection ID starts with the server ID the server chose for it, " +
			"each from a new random address in 127.128.0.0/9 and port, full rate",
			Flood: &FloodSpec{Spoofed: spoofedNet, Attacker: a(67, 0, 1), Kind: PacketIDShort}},
		{Name: "id-spray-fixed", Description: "the attacker's own connection from 127.67.1.1, and the same short headers " +
			"carrying its server ID from one other address, 127.67.1.2 (one socket), full rate",
			Flood: &FloodSpec{Sources: []netip.Addr{a(67, 1, 2)}, Attacker: a(67, 1, 1), Kind: PacketIDShort}},
		{Name: "answered-reuse", Returning: true, Description: "real ClientHellos (one Initial each) from 2000 spoofed addresses " +
			"in 127.129.0.0/16, 900 a second for at most half the flood, which quic-go answers; then, from the addresses warmed, " +
			"short headers with random connection IDs and Handshakes to random 4-byte IDs in turn, full rate; " +
			"and a returning client (127.77.0.3), connected before the flood, that reconnects 5 times a second",
			Flood: &FloodSpec{Spoofed: answeredNet, SpoofedSet: answeredSet, Warmup: true, Kind: PacketReuse}},
		{Name: "id-long-headers", Description: "the attacker's own connection from 127.67.3.1, and 1200-byte Initials and " +
			"Handshakes of 60 to 1200 bytes in turn whose destination connection ID is its server ID, from a new random address in " +
			"127.128.0.0/9 and port and from one other address, 127.67.3.2, in turn, full rate",
			Flood: &FloodSpec{Spoofed: spoofedNet, Sources: []netip.Addr{a(67, 3, 2)}, Attacker: a(67, 3, 1), Kind: PacketIDLong}},
		{Name: "transfers", Transfers: true, Description: "no flood: one 200 MB download, one 100 MB upload, " +
			"20 x 10 MB downloads over one connection and over 20 connections from 20 /24s; then Caddy's stop"},
		{Name: "id-guess", Description: "16 real ClientHellos from one victim address, 127.130.0.1 (spoofed), which quic-go answers " +
			"(the server binds their IDs to it, 8 held); then, from that address alone, Handshakes of 60 to 1200 bytes and 1200-byte " +
			"Initials to random 4-byte destination IDs (guesses at a proof) and short headers with random IDs, in turn, full rate",
			Flood: &FloodSpec{Spoofed: guessNet, SpoofedSet: 1, Warmup: true, WarmupFlights: guessFlights, Kind: PacketGuess}},
		{Name: "borrowed-proof", Description: "the attacker's own connection from 127.67.4.1; one real ClientHello spoofed from a victim, " +
			"127.133.0.1, which quic-go answers; during the flood the attacker adds a path from the victim's address every 150 ms " +
			"(a socket that never reads) and probes it, which quic-go answers with a PATH_CHALLENGE there; and 1200-byte short " +
			"headers with random IDs from the victim's address, full rate",
			Flood: &FloodSpec{Spoofed: borrowedNet, SpoofedSet: 1, Warmup: true, Attacker: a(67, 4, 1), PathProbes: true, Kind: PacketShort}},
		{Name: "proven-botnet", Timeline: true, Stranger: true, Description: "60 bots, 127.131.0.1 to 127.131.59.1 (one per /24), each " +
			"with a real connection that proves its address (a Handshake to the server ID it read); then Initial-like 1200-byte datagrams " +
			"from the bots' addresses, new random ports, 900 a second each (54,000 in all), under every per-address limit, over the " +
			"opening total; and a stranger client, 25 new connections a second, each from a new address of 127.76.0.0/24",
			Flood: &FloodSpec{Spoofed: botNet, SpoofedSet: bots, Prove: true, Rate: bots * botRate, Kind: PacketInitial}},
		{Name: "returning-flooded-24", Returning: true, ReturningFrom: floodedReturning, ReturningKeeps: true,
			Description: "a returning client at 127.132.0.3, connected before the flood, which keeps that connection (25 requests a second) " +
				"and opens a new one 5 times a second; from random other addresses of its /24 (spoofed), short headers with random IDs " +
				"and Initial-like 1200-byte datagrams in turn, full rate",
			Flood: &FloodSpec{Spoofed: floodedNet, SpoofedExcept: floodedReturning, Kind: PacketShortInitial}},
	}
}

// ScenarioNames lists the scenario names in order.
func ScenarioNames() []string {
	var names []string
	for _, s := range Scenarios() {
		names = append(names, s.Name)
	}
	return names
}
