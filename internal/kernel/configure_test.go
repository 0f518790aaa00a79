//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// kernelState is what the kernel holds of a filter's configuration: the
// slot in force, both slots' contents and the allowlists' entries.
type kernelState struct {
	active uint32
	slots  [2]rakelimitConfig
	allow  allowSet
}

func readKernelState(t *testing.T, f *Program) kernelState {
	t.Helper()
	var ks kernelState
	var err error
	if ks.active, err = f.ActiveSlot(); err != nil {
		t.Fatal(err)
	}
	for i := range ks.slots {
		if err := f.objs.Configs.Lookup(uint32(i), &ks.slots[i]); err != nil {
			t.Fatal(err)
		}
	}
	ks.allow = allowSet{}
	var k4 rakelimitAllow4Key
	var k6 rakelimitAllow6Key
	var v uint8
	for it := f.objs.Allow4.Iterate(); it.Next(&k4, &v); {
		ks.allow[allowEntry{bits: k4.Prefixlen, addr: netip.AddrFrom4(k4.Addr).As16()}] = true
	}
	for it := f.objs.Allow6.Iterate(); it.Next(&k6, &v); {
		ks.allow[allowEntry{v6: true, bits: k6.Prefixlen, addr: k6.Addr}] = true
	}
	return ks
}

// prefixes returns n distinct IPv4 /32 prefixes in 10.<base>.0.0/16 and up.
func prefixes(base, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		a := netip.AddrFrom4([4]byte{10, byte(base + i>>16), byte(i >> 8), byte(i)})
		out[i] = netip.PrefixFrom(a, 32)
	}
	return out
}

// withAllow is c with the allowlist a, and dryRun.
func withAllow(c decide.Config, a []netip.Prefix, dryRun bool) decide.Config {
	c.Allow, c.DryRun = a, dryRun
	return c
}

// TestConfigureAllOrNothing: a configuration the filter cannot take leaves
// the kernel and the Go side exactly as they were: the slot in force, both
// slots, the allowlists, Params and the configuration. That holds for a
// refusal found by the checks (1,100 allowlist prefixes for a trie of 1,024,
// a new lattice, a bad limit) and for a failure half way, after some of the
// new allowlist entries went in (forced by filling the trie from outside).
func TestConfigureAllOrNothing(t *testing.T) {
	base := withAllow(testutil.Limits(100), prefixes(0, 10), false)
	big := testutil.Limits(5000)
	perDport := testutil.Limits(5000)
	perDport.Limiter.PerDstPort = true
	tests := []struct {
		name string
		cfg  decide.Config
		// foreign entries put into the trie behind the filter's back,
		// so that adding fails part way.
		foreign int
		want    []string
	}{
		{"1,100 allowlist prefixes", withAllow(big, prefixes(1, 1100), false), 0,
			[]string{"allow: 1100 IPv4 prefixes", "1024"}},
		{"new lattice", withAllow(perDport, prefixes(0, 10), false), 0, []string{"cannot change the lattice"}},
		{"bad limit", withAllow(testutil.Limits(0), prefixes(0, 10), false), 0, []string{"limit 0"}},
		{"trie full half way", withAllow(big, append(prefixes(0, 10), prefixes(2, 20)...), false),
			decide.MaxAllow - 10 - 7, []string{"adding", "to the allowlist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadTest(t, base, loadOptions{})
			for _, p := range prefixes(100, tt.foreign) {
				if err := f.allowAdd(allowEntry{bits: 32, addr: p.Addr().As16()}); err != nil {
					t.Fatalf("filling the trie: %v", err)
				}
			}
			before := readKernelState(t, f)
			params, cfg := f.Params(), f.Config()
			err := f.Configure(tt.cfg)
			if err == nil {
				t.Fatal("Configure succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			after := readKernelState(t, f)
			if after.active != before.active || !reflect.DeepEqual(after.slots[after.active], before.slots[before.active]) {
				t.Errorf("the configuration in force changed: slot %d -> %d", before.active, after.active)
			}
			if !reflect.DeepEqual(after.allow, before.allow) {
				t.Errorf("the allowlist changed: %d entries -> %d", len(before.allow), len(after.allow))
			}
			if f.Params() != params || !reflect.DeepEqual(f.Config(), cfg) || !reflect.DeepEqual(f.allow, newAllowSet(base.Allow)) {
				t.Errorf("the Go side changed: %+v", f.Config())
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestConfigureSwitchesOnce: a new limit, dry run and allowlist go in with
// one switch of the configuration slot; the slot that was in force is not
// written (a packet still reading it sees it whole), the new slot holds the
// new settings, and the allowlist ends up holding exactly the new list, also
// when old and new lists together exceed the trie.
func TestConfigureSwitchesOnce(t *testing.T) {
	f := loadTest(t, testutil.Limits(100), loadOptions{})
	lim := func(l uint32, w time.Duration) decide.Config {
		c := testutil.Limits(l)
		c.Limiter.Window = w
		return c
	}
	steps := []decide.Config{
		withAllow(lim(5000, 2*time.Second), prefixes(0, 10), true),
		withAllow(lim(300, time.Second), prefixes(0, 1000), false),
		// 1,000 entries out, 1,000 others in: 2,000 would not fit at once.
		withAllow(lim(400, time.Second), prefixes(5, 1000), false),
		withAllow(testutil.QUICLimits(400, 4000), append(prefixes(5, 10), netip.MustParsePrefix("2001:db8::/32")), false),
		lim(400, time.Second),
	}
	for i, c := range steps {
		before := readKernelState(t, f)
		if err := f.Configure(c); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		after := readKernelState(t, f)
		if after.active == before.active {
			t.Fatalf("step %d: the slot in force is still %d: switched twice, or not at all", i, after.active)
		}
		if !reflect.DeepEqual(after.slots[before.active], before.slots[before.active]) {
			t.Errorf("step %d: the slot that was in force was written", i)
		}
		p, err := sketch.Compile(c.Limiter)
		if err != nil {
			t.Fatal(err)
		}
		if want := f.compiled(c, p, newAllowSet(c.Allow)); !reflect.DeepEqual(after.slots[after.active], *want) {
			t.Errorf("step %d: the new slot does not hold the new settings", i)
		}
		if !reflect.DeepEqual(after.allow, newAllowSet(c.Allow)) {
			t.Errorf("step %d: the allowlist has %d entries, want the %d configured", i, len(after.allow), len(c.Allow))
		}
		if n, err := f.AllowEntries(); err != nil || n != len(c.Allow) {
			t.Errorf("step %d: AllowEntries = %d, %v", i, n, err)
		}
	}
}

// TestConfigureRaceReaders changes the configuration while the stream readers
// run, as a reload does while Caddy logs limited streams; under -race this
// fails if the readers read shared state without the filter's lock.
func TestConfigureRaceReaders(t *testing.T) {
	f := loadTest(t, testutil.Limits(25), loadOptions{})
	if _, _, err := f.objs.Rakelimit.Benchmark(udp("198.51.100.7", 5000).Bytes(), 10_000, nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := f.Streams(); err != nil {
				t.Error(err)
				return
			}
			if _, err := f.ExpireStreams(time.Hour); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for i := range 200 {
		if err := f.Configure(withAllow(testutil.Limits(25+uint32(i%5)), nil, i%2 == 0)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	streams, err := f.Streams()
	if err != nil || len(streams) != 1 {
		t.Fatalf("streams %v, %v", streams, err)
	}
}

// TestLoadErrorOneLine: the errors explainLoad makes are one line, name what
// is missing and never carry the BPF library's MEMLOCK hint; a verifier
// refusal keeps its log apart.
func TestLoadErrorOneLine(t *testing.T) {
	longLog := make([]string, 5000)
	for i := range longLog {
		longLog[i] = fmt.Sprintf("%d: (bf) r%d = r1 ; R1=ctx()", i, i%10)
	}
	longLog[len(longLog)-2] = "R2 pointer arithmetic with it prohibited for !root"
	longLog[len(longLog)-1] = "processed 5000 insns (limit 1000000) max_states_per_insn 4"
	ve := &ebpf.VerifierError{Cause: unix.EACCES, Log: longLog}
	memlock := fmt.Errorf("map create: %w (MEMLOCK may be too low, consider rlimit.RemoveMemlock)", unix.EPERM)
	for _, tt := range []struct {
		name    string
		err     error
		missing []string
		want    []string
	}{
		{"CAP_BPF without CAP_PERFMON", fmt.Errorf("load program: %w", ve), []string{"CAP_PERFMON"},
			[]string{"lacks CAP_PERFMON", "setcap cap_bpf,cap_perfmon,cap_net_bind_service+p",
				"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE"}},
		{"no capability", memlock, []string{"CAP_BPF", "CAP_PERFMON"},
			[]string{"operation not permitted", "lacks CAP_BPF and CAP_PERFMON", "setcap cap_bpf,cap_perfmon"}},
		{"EPERM with the capabilities", memlock, nil, []string{"operation not permitted", "seccomp"}},
		{"verifier", fmt.Errorf("load program: %w", ve), nil, []string{"verifier of Linux " + kernelRelease() + " rejected it", "prohibited for !root", "DEBUG", "needs Linux 6.1 or later"}},
		{"other", fmt.Errorf("map create: %w", unix.EINVAL), nil, []string{"invalid argument", "needs Linux 6.1 or later"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := explain(tt.err, tt.missing)
			msg := err.Error()
			if strings.Contains(msg, "\n") || len(msg) > 600 || strings.Contains(msg, "MEMLOCK") {
				t.Errorf("error of %d bytes, not one short line: %q", len(msg), msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatal("not a LoadError")
			}
			if errors.As(tt.err, new(*ebpf.VerifierError)) && len(le.VerifierLog) != len(longLog) {
				t.Errorf("verifier log of %d lines kept, want %d", len(le.VerifierLog), len(longLog))
			}
		})
	}
}
