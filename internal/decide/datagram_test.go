package decide

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

const start = int64(1000 * time.Second)

// newFilter returns a filter for c whose limiter hashes with the zero key
// (the tests choose sources that share cells or not by their prefixes),
// and whose learned sets hash with a seeded one (a zero key would put every
// key in one slot).
func newFilter(t *testing.T, c Config) *Filter {
	t.Helper()
	var hk sketch.HashKey
	seeded := sketch.SeededHashKey(11)
	hk.LearnID, hk.LearnAddr = seeded.LearnID, seeded.LearnAddr
	f, err := New(c, hk)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func quicConfig() Config {
	return Config{
		Limiter:      sketch.Config{Limit: 100, Window: time.Second, Established: sketch.Limits{Limit: 10_000}},
		Classify:     true,
		BlockedPorts: quicclass.DefaultBlockedPorts(),
		Negotiation:  10,
	}
}

// dgram is a datagram from src with payload b.
func dgram(src string, b []byte) *Datagram {
	return &Datagram{Key: sketch.KeyFrom(netip.MustParseAddrPort(src), 443), Length: len(b),
		Probe: b[:min(len(b), quicclass.ProbeBytes)]}
}

func TestDecideClasses(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		d      *Datagram
		class  quicclass.Class
		reason quicclass.Reason
		drop   bool
	}{
		{"initial", nil, dgram("192.0.2.1:50000", quicclasstest.Initial()), quicclass.Opening, 0, false},
		{"short header", nil, dgram("192.0.2.1:50000", quicclasstest.ShortHeader(100)), quicclass.Established, 0, false},
		{"junk", nil, dgram("192.0.2.1:50000", make([]byte, 50)), quicclass.Invalid, quicclass.FixedBit, true},
		{"junk in a dry run", func(c *Config) { c.DryRun = true }, dgram("192.0.2.1:50000", make([]byte, 50)),
			quicclass.Invalid, quicclass.FixedBit, false},
		{"from port 123", nil, dgram("192.0.2.1:123", quicclasstest.Initial()), quicclass.Invalid, quicclass.SourcePort, true},
		{"no blocked ports", func(c *Config) { c.BlockedPorts = nil }, dgram("192.0.2.1:123", quicclasstest.Initial()), quicclass.Opening, 0, false},
		{"no UDP header", nil, &Datagram{Key: sketch.Key{Family: sketch.IPv4}}, quicclass.Invalid, quicclass.Unparsed, true},
		{"not classifying", func(c *Config) { c.Classify = false }, dgram("192.0.2.1:53", make([]byte, 50)), quicclass.Opening, 0, false},
		{"negotiation", nil, dgram("192.0.2.1:50000", quicclasstest.UnknownVersion()), quicclass.Negotiation, 0, false},
		{"negotiation off", func(c *Config) { c.Negotiation = 0 }, dgram("192.0.2.1:50000", quicclasstest.UnknownVersion()), quicclass.Negotiation, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := quicConfig()
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			f := newFilter(t, c)
			out := f.Decide(tt.d, start, 0)
			if out.Class != tt.class || out.Reason != tt.reason || out.Drop != tt.drop {
				t.Fatalf("Decide = %+v, want class %v reason %v drop %v", out, tt.class, tt.reason, tt.drop)
			}
			st := f.Stats()
			fam := FamilyIndex(tt.d.Key.Family)
			var counted uint64
			switch tt.class {
			case quicclass.Invalid:
				counted = st.Invalid[0][fam][tt.reason] + st.Invalid[1][fam][tt.reason]
			case quicclass.Negotiation:
				counted = st.Negotiation[fam][0] + st.Negotiation[fam][1] + st.Negotiation[fam][2]
			default:
				counted = st.Passed[tt.class][fam]
			}
			if counted != 1 {
				t.Fatalf("not counted: %+v", st)
			}
		})
	}
}

// TestNegotiationCap: unknown versions pass at the configured rate, with a
// burst of as many, for the whole socket.
func TestNegotiationCap(t *testing.T) {
	f := newFilter(t, quicConfig()) // 10 per second
	passed := 0
	for i := range 3000 { // 3 s at 1000 per second from many sources
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 40000)
		d := dgram(src.String(), quicclasstest.UnknownVersion())
		if !f.Decide(d, start+int64(i)*int64(time.Millisecond), 0).Drop {
			passed++
		}
	}
	// The burst of 10, then 10 per second for 3 s.
	if passed < 38 || passed > 41 {
		t.Fatalf("%d of 3000 passed at a cap of 10 per second", passed)
	}
	st := f.Stats()
	if st.Negotiation[1][0] != uint64(passed) || st.Negotiation[1][1] != uint64(3000-passed) {
		t.Fatalf("counters %v", st.Negotiation)
	}
}

// TestAllowlistFamilies: an IPv6 prefix never covers IPv4 sources, even ::/0,
// and IPv4 prefixes match IPv4 sources however they are written.
func TestAllowlistFamilies(t *testing.T) {
	tests := []struct {
		allow string
		src   string
		want  bool
	}{
		{"::/0", "192.0.2.1:5000", false},
		{"::/0", "[2001:db8::1]:5000", true},
		{"::ffff:0:0/96", "192.0.2.1:5000", false},
		{"0.0.0.0/0", "192.0.2.1:5000", true},
		{"0.0.0.0/0", "[2001:db8::1]:5000", false},
		{"192.0.2.0/24", "192.0.2.1:5000", true},
		{"192.0.2.0/24", "192.0.3.1:5000", false},
		{"2001:db8::/32", "[2001:db8:1::1]:5000", true},
	}
	for _, tt := range tests {
		t.Run(tt.allow+" "+tt.src, func(t *testing.T) {
			c := quicConfig()
			c.Allow = []netip.Prefix{netip.MustParsePrefix(tt.allow)}
			f := newFilter(t, c)
			d := dgram(tt.src, quicclasstest.Initial())
			out := f.Decide(d, start, 0)
			// An allowlisted Initial is counted as allowed, any other by
			// the limiter. (An invalid datagram no longer tells them
			// apart: the allowlist does not exempt from validity.)
			st, fam := f.Stats(), FamilyIndex(d.Key.Family)
			limited := uint64(1)
			if tt.want {
				limited = 0
			}
			if out.Allowlisted != tt.want || out.Drop || st.Allowed[fam] != 1-limited || st.Passed[quicclass.Opening][fam] != limited {
				t.Fatalf("Decide = %+v, allowed %d, passed by the limiter %d; want allowlisted %v", out,
					st.Allowed[fam], st.Passed[quicclass.Opening][fam], tt.want)
			}
		})
	}
}

// TestAllowlistKeepsValidity: an allowlisted source skips the limiter, not
// the classification: its invalid datagrams, from a blocked port among
// them, are dropped and counted as invalid, and its unknown versions are
// paced, as anyone's (a spoofer can send from an allowlisted address).
func TestAllowlistKeepsValidity(t *testing.T) {
	notQUIC := make([]byte, 64)
	smallUnknown := quicclasstest.UnknownVersion()[:300]
	tests := []struct {
		name        string
		src         string
		b           []byte
		allowlisted bool
		class       quicclass.Class
		reason      quicclass.Reason
		drop        bool
	}{
		{"initial", "192.0.2.1:50000", quicclasstest.Initial(), true, quicclass.Opening, 0, false},
		{"short header", "192.0.2.1:50000", quicclasstest.ShortHeader(100), true, quicclass.Established, 0, false},
		{"fixed bit 0", "192.0.2.1:50000", notQUIC, false, quicclass.Invalid, quicclass.FixedBit, true},
		{"reflection port", "192.0.2.1:53", quicclasstest.Initial(), false, quicclass.Invalid, quicclass.SourcePort, true},
		{"empty", "192.0.2.1:50000", []byte{}, false, quicclass.Invalid, quicclass.Empty, true},
		{"small unknown version", "192.0.2.1:50000", smallUnknown, false, quicclass.Invalid, quicclass.SmallUnknownVersion, true},
		{"unknown version", "192.0.2.1:50000", quicclasstest.UnknownVersion(), false, quicclass.Negotiation, 0, false},
		{"ipv6 fixed bit 0", "[2001:db8::1]:50000", notQUIC, false, quicclass.Invalid, quicclass.FixedBit, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := quicConfig()
			c.Allow = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
			f := newFilter(t, c)
			d := dgram(tt.src, tt.b)
			out := f.Decide(d, start, 0)
			if out.Allowlisted != tt.allowlisted || out.Class != tt.class || out.Reason != tt.reason || out.Drop != tt.drop {
				t.Fatalf("Decide = %+v, want allowlisted %v, %v/%v, drop %v", out, tt.allowlisted, tt.class, tt.reason, tt.drop)
			}
			st := f.Stats()
			fam := FamilyIndex(d.Key.Family)
			var allowed, invalid uint64 = 0, 0
			if tt.allowlisted {
				allowed = 1
			}
			if tt.class == quicclass.Invalid {
				invalid = 1
			}
			if st.Allowed[fam] != allowed || st.Invalid[0][fam][tt.reason] != invalid {
				t.Fatalf("counted %d allowed and %d invalid (%v), want %d and %d", st.Allowed[fam],
					st.Invalid[0][fam][tt.reason], tt.reason, allowed, invalid)
			}
		})
	}
}

// TestUpdateKeepsCounts: a new configuration keeps the counters and the
// sketches.
func TestUpdateKeepsCounts(t *testing.T) {
	f := newFilter(t, quicConfig())
	for i := range 500 {
		f.Decide(dgram("192.0.2.1:50000", quicclasstest.Initial()), start+int64(i)*int64(time.Millisecond), 0)
	}
	before := f.Stats()
	c := quicConfig()
	c.Limiter.Limit = 1000
	if err := f.Update(c); err != nil {
		t.Fatal(err)
	}
	if f.Stats() != before {
		t.Fatal("Update changed the counters")
	}
	c.Negotiation = MaxNegotiation + 1
	if err := f.Update(c); err == nil {
		t.Fatal("Update accepted a bad negotiation rate")
	}
}
