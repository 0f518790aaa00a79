package sketch

import (
	"fmt"
	"net/netip"
	"sort"
)

// Node is a lattice node: one generalisation of a packet's key. Bits 2-3 hold
// the source prefix slot (0 is the most specific prefix), bit 1 is set when the
// source port is a wildcard and bit 0 when the destination port is.
type Node uint8

// NewNode returns the node for a prefix slot and port wildcards.
func NewNode(prefix int, srcPortAny, dstPortAny bool) Node {
	n := Node(prefix << 2)
	if srcPortAny {
		n |= 2
	}
	if dstPortAny {
		n |= 1
	}
	return n
}

// Prefix returns the node's source prefix slot.
func (n Node) Prefix() int { return int(n >> 2) }

// SrcPortAny reports whether the node ignores the source port.
func (n Node) SrcPortAny() bool { return n&2 != 0 }

// DstPortAny reports whether the node ignores the destination port.
func (n Node) DstPortAny() bool { return n&1 != 0 }

// Level is the number of generalisations applied: the prefix slot plus one for
// each wildcard port.
func (n Node) Level() int {
	return n.Prefix() + int(n>>1&1) + int(n&1)
}

// Describe names the node for one family, for example "/24 sport=*" or, with
// the destination port dimension, "/32 sport=N dport=*" (N: each port apart).
func (n Node) Describe(p *Params, fam Family) string {
	s := fmt.Sprintf("/%d sport=", p.PrefixLen(fam, n.Prefix()))
	if n.SrcPortAny() {
		s += "*"
	} else {
		s += "N"
	}
	if p.PerDstPort {
		if n.DstPortAny() {
			s += " dport=*"
		} else {
			s += " dport=N"
		}
	}
	return s
}

// Stream names the stream a key belongs to at node n, the way an operator
// reads it: "198.51.100.0/24 sport=* -> :443".
func (n Node) Stream(p *Params, k *Key) string {
	var src string
	switch k.Family {
	case IPv4, IPv6:
		pl := p.PrefixLen(k.Family, n.Prefix())
		if pl == 0 {
			src = "*"
		} else {
			pfx, _ := k.Addr().Prefix(pl)
			src = pfx.String()
		}
	default:
		src = "*"
	}
	sport := "*"
	if !n.SrcPortAny() && k.HasPorts {
		sport = fmt.Sprint(k.SrcPort)
	}
	dport := ":*"
	if !n.DstPortAny() && k.HasPorts {
		dport = fmt.Sprintf(":%d", k.DstPort)
	}
	return fmt.Sprintf("%s sport=%s -> %s", src, sport, dport)
}

// applies reports whether node n counts packets with key k: a packet without
// ports only reaches port-wildcard nodes, and one without an address only the
// all-sources nodes.
func applies(p *Params, n Node, k *Key) bool {
	if !k.HasPorts && (!n.SrcPortAny() || (p.PerDstPort && !n.DstPortAny())) {
		return false
	}
	return k.Family != Unknown || n.Prefix() == p.NumPrefixes-1
}

// latticeOrder lists the nodes of the lattice, by level and, within a level,
// from the most specific address down. Without the destination port
// dimension only nodes with a specified destination port are kept: for one
// socket they count exactly what their dport-wildcard twins would.
func latticeOrder(prefixes int, perDstPort bool) []Node {
	var nodes []Node
	for p := range prefixes {
		for _, sAny := range []bool{false, true} {
			for _, dAny := range []bool{false, true} {
				if dAny && !perDstPort {
					continue
				}
				nodes = append(nodes, NewNode(p, sAny, dAny))
			}
		}
	}
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Level() < nodes[j].Level() })
	return nodes
}

// Family is a packet's address family, as the filter classifies it.
type Family uint8

// Families. Unknown is a packet whose network header could not be parsed; it
// is still counted, at the all-sources nodes.
const (
	Unknown Family = 0 // C: FAMILY_UNKNOWN
	IPv4    Family = 4 // C: FAMILY_IPV4
	IPv6    Family = 6 // C: FAMILY_IPV6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return "unknown"
}

// Key is what the limiter knows of a packet: the source address and the
// ports. The destination address is the socket's own and is left out.
type Key struct {
	Family Family
	// Words is the source address as big-endian 32-bit words; IPv4 uses
	// Words[0] only and leaves the others zero.
	Words [4]uint32
	// HasPorts is false when the transport header could not be read; the
	// packet then counts only at source-port-wildcard nodes.
	HasPorts         bool
	SrcPort, DstPort uint16
	// Returning marks a returning user's connection-opening packet (the
	// filter sets it for an Initial or 0-RTT packet from a proven peer, or
	// from an answered peer that spent a credit): it passes the nodes of
	// the source's network and wider (Params.ReturningExempt) as if under
	// their limits, so that a flood from other addresses of its network
	// does not cut it off, while the nodes of its own address judge it;
	// the screen leaves it to the walk; and at the fair total it goes
	// before every other source (rank 0) while the returning part of the
	// total (ReturningShareShift) has room, and is ranked as anyone past
	// it. It is not part of the hashed key.
	Returning bool
}

// KeyFrom builds the key of a UDP packet from src to local port dstPort.
// IPv4-mapped IPv6 addresses are treated as IPv4.
func KeyFrom(src netip.AddrPort, dstPort uint16) Key {
	k := Key{HasPorts: true, SrcPort: src.Port(), DstPort: dstPort}
	a := src.Addr().Unmap()
	b := a.As16()
	if a.Is4() {
		k.Family = IPv4
		k.Words[0] = be32(b[12:])
		return k
	}
	k.Family = IPv6
	for i := range k.Words {
		k.Words[i] = be32(b[4*i:])
	}
	return k
}

// Addr returns the key's source address.
func (k *Key) Addr() netip.Addr {
	var b [16]byte
	for i, w := range k.Words {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w>>24), byte(w>>16), byte(w>>8), byte(w)
	}
	if k.Family == IPv4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
