package decide

import (
	"net/netip"
	"slices"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// allowlist holds the allowlisted prefixes by family and length. IPv4 and
// IPv6 are kept apart: an IPv6 prefix never covers an IPv4 source, even
// ::/0 or one within ::ffff:0:0/96 (IPv4-mapped prefixes are given as IPv4).
type allowlist struct {
	// lens lists, per family (0 IPv4, 1 IPv6), the prefix lengths in use,
	// longest first; set holds the masked prefixes.
	lens [2][]int
	set  map[netip.Prefix]bool
}

func newAllowlist(prefixes []netip.Prefix) allowlist {
	a := allowlist{set: map[netip.Prefix]bool{}}
	for _, p := range prefixes {
		p = p.Masked()
		fi := 0
		if p.Addr().Is6() {
			fi = 1
		}
		if !slices.Contains(a.lens[fi], p.Bits()) {
			a.lens[fi] = append(a.lens[fi], p.Bits())
		}
		a.set[p] = true
	}
	for fi := range a.lens {
		slices.Sort(a.lens[fi])
		slices.Reverse(a.lens[fi])
	}
	return a
}

// has reports whether k's source address is allowlisted.
func (a *allowlist) has(k *sketch.Key) bool {
	if len(a.set) == 0 || k.Family == sketch.Unknown {
		return false
	}
	fi := 0
	if k.Family == sketch.IPv6 {
		fi = 1
	}
	addr := k.Addr()
	for _, l := range a.lens[fi] {
		p, _ := addr.Prefix(l)
		if a.set[p] {
			return true
		}
	}
	return false
}
