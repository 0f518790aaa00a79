//go:build linux

package kernel

// The allowlist (c/allow.h): its prefixes in the two tries, and the quick
// filter in front of them.

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/cilium/ebpf"
)

// allowEntry is an allowlist prefix as one of the two tries keys it.
type allowEntry struct {
	v6   bool
	bits uint32
	addr [16]byte
}

// allowSet is a set of allowlist entries.
type allowSet map[allowEntry]bool

func newAllowSet(prefixes []netip.Prefix) allowSet {
	s := allowSet{}
	for _, p := range prefixes {
		p = p.Masked()
		s[allowEntry{v6: p.Addr().Is6(), bits: uint32(p.Bits()), addr: p.Addr().As16()}] = true
	}
	return s
}

// family is 0 for IPv4, 1 for IPv6.
func (e allowEntry) family() int {
	if e.v6 {
		return 1
	}
	return 0
}

func (e allowEntry) prefix() netip.Prefix {
	a := netip.AddrFrom16(e.addr)
	if !e.v6 {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, int(e.bits))
}

func (f *Program) allowAdd(e allowEntry) error {
	if e.v6 {
		return f.objs.Allow6.Update(rakelimitAllow6Key{Prefixlen: e.bits, Addr: e.addr}, uint8(1), ebpf.UpdateAny)
	}
	var a [4]byte
	copy(a[:], e.addr[12:])
	return f.objs.Allow4.Update(rakelimitAllow4Key{Prefixlen: e.bits, Addr: a}, uint8(1), ebpf.UpdateAny)
}

func (f *Program) allowDelete(e allowEntry) error {
	var err error
	if e.v6 {
		err = f.objs.Allow6.Delete(rakelimitAllow6Key{Prefixlen: e.bits, Addr: e.addr})
	} else {
		var a [4]byte
		copy(a[:], e.addr[12:])
		err = f.objs.Allow4.Delete(rakelimitAllow4Key{Prefixlen: e.bits, Addr: a})
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// The allowlist's quick-reject filter, as in internal/kernel/c/allow.h: a
// bit per bucket of a multiplicative hash of an address's top 16 (IPv4) or
// 32 (IPv6) bits.
const (
	allowFilterShift = 10                    // C: ALLOW_FILTER_SHIFT
	allowFilterBits  = 1 << allowFilterShift // C: ALLOW_FILTER_BITS
	allowHashMul     = 0x9E3779B1            // C: ALLOW_HASH_MUL
)

// allowBucket is the bucket of an address's top bits.
func allowBucket(top uint32) uint32 { return top * allowHashMul >> (32 - allowFilterShift) }

// allowFilter computes, per family, the buckets the prefixes cover, or that
// a family's prefixes are too short to enumerate (always look up).
func allowFilter(prefixes []netip.Prefix) (filter [2][allowFilterBits / 64]uint64, always [2]uint8) {
	for _, p := range prefixes {
		fi, topBits := 0, 16
		if p.Addr().Is6() {
			fi, topBits = 1, 32
		}
		b := p.Addr().As16()
		off := 12
		if fi == 1 {
			off = 0
		}
		word := binary.BigEndian.Uint32(b[off:])
		top := word >> (32 - topBits)
		if p.Bits() >= topBits {
			n := allowBucket(top)
			filter[fi][n/64] |= 1 << (n % 64)
			continue
		}
		span := topBits - p.Bits()
		if span > allowFilterShift {
			always[fi] = 1 // covers more tops than there are buckets
			continue
		}
		first := top &^ (1<<span - 1)
		for t := first; t < first+1<<span; t++ {
			n := allowBucket(t)
			filter[fi][n/64] |= 1 << (n % 64)
		}
	}
	return filter, always
}
