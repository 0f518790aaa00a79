//go:build linux

package bpf

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

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// kernelState is what the kernel holds of a filter's configuration: the
// slot in force, both slots' contents and the allowlist's keys.
type kernelState struct {
	active uint32
	slots  [2]rakelimitConfig
	allow  map[rakelimitAllowKey]bool
}

func readKernelState(t *testing.T, f *Filter) kernelState {
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
	ks.allow = map[rakelimitAllowKey]bool{}
	var k rakelimitAllowKey
	var v uint8
	it := f.objs.Allowlist.Iterate()
	for it.Next(&k, &v) {
		ks.allow[k] = true
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
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

func keysOf(ps []netip.Prefix) map[rakelimitAllowKey]bool {
	m := map[rakelimitAllowKey]bool{}
	for _, p := range ps {
		m[allowKey(p)] = true
	}
	return m
}

// TestConfigureAllOrNothing: a configuration the filter cannot take leaves
// the kernel and the Go side exactly as they were: the slot in force, both
// slots, the allowlist, Params and the options. That holds for a refusal
// found by the checks (1,100 allowlist prefixes for a trie of 1,024, a new
// lattice, a bad track shift) and for a failure half way, after some of the
// new allowlist entries went in (forced by filling the trie from outside).
func TestConfigureAllOrNothing(t *testing.T) {
	base := sketch.Config{Limit: 100, Window: time.Second}
	baseOpts := Options{Allow: prefixes(0, 10), TrackShift: DefaultTrackShift}
	big := sketch.Config{Limit: 5000, Window: time.Second}
	tests := []struct {
		name string
		cfg  sketch.Config
		opts Options
		// foreign entries put into the trie behind the filter's back,
		// so that adding fails part way.
		foreign int
		want    []string
	}{
		{"1,100 allowlist prefixes", big, Options{Allow: prefixes(1, 1100), TrackShift: DefaultTrackShift}, 0,
			[]string{"allow: 1100 prefixes", "1024"}},
		{"new lattice", sketch.Config{Limit: 5000, Window: time.Second, PerDstPort: true}, baseOpts, 0,
			[]string{"cannot change the lattice"}},
		{"bad track shift", big, Options{TrackShift: 40}, 0, []string{"track shift 40"}},
		{"bad limit", sketch.Config{Limit: 0, Window: time.Second}, baseOpts, 0, []string{"limit 0"}},
		{"trie full half way", big, Options{Allow: append(prefixes(0, 10), prefixes(2, 20)...), TrackShift: DefaultTrackShift},
			MaxAllow - 10 - 7, []string{"adding to the allowlist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadTest(t, base, loadOptions{})
			if err := f.Configure(base, baseOpts); err != nil {
				t.Fatal(err)
			}
			foreign := prefixes(100, tt.foreign)
			for _, p := range foreign {
				if err := f.objs.Allowlist.Update(allowKey(p), uint8(1), ebpf.UpdateAny); err != nil {
					t.Fatalf("filling the trie: %v", err)
				}
			}
			before := readKernelState(t, f)
			params := f.Params()
			err := f.Configure(tt.cfg, tt.opts)
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
			if f.Params() != params || !reflect.DeepEqual(f.opts, baseOpts) || !reflect.DeepEqual(f.allow, keysOf(baseOpts.Allow)) {
				t.Errorf("the Go side changed: opts %+v", f.opts)
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
	f := loadTest(t, sketch.Config{Limit: 100, Window: time.Second}, loadOptions{})
	steps := []struct {
		cfg  sketch.Config
		opts Options
	}{
		{sketch.Config{Limit: 5000, Window: 2 * time.Second}, Options{DryRun: true, Allow: prefixes(0, 10), TrackShift: 3}},
		{sketch.Config{Limit: 300, Window: time.Second}, Options{Allow: prefixes(0, 1000), TrackShift: DefaultTrackShift}},
		// 1,000 entries out, 1,000 others in: 2,000 would not fit at once.
		{sketch.Config{Limit: 400, Window: time.Second}, Options{Allow: prefixes(5, 1000), TrackShift: DefaultTrackShift}},
		{sketch.Config{Limit: 400, Window: time.Second}, Options{TrackShift: DefaultTrackShift}},
	}
	for i, st := range steps {
		before := readKernelState(t, f)
		if err := f.Configure(st.cfg, st.opts); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		after := readKernelState(t, f)
		if after.active == before.active {
			t.Fatalf("step %d: the slot in force is still %d: switched twice, or not at all", i, after.active)
		}
		if !reflect.DeepEqual(after.slots[before.active], before.slots[before.active]) {
			t.Errorf("step %d: the slot that was in force was written", i)
		}
		p, err := sketch.Compile(st.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if want := f.slotConfig(p, st.opts, len(st.opts.Allow) > 0); !reflect.DeepEqual(after.slots[after.active], want) {
			t.Errorf("step %d: the new slot does not hold the new settings", i)
		}
		if !reflect.DeepEqual(after.allow, keysOf(st.opts.Allow)) {
			t.Errorf("step %d: the allowlist has %d entries, want the %d configured", i, len(after.allow), len(st.opts.Allow))
		}
		if n, err := f.AllowEntries(); err != nil || n != len(st.opts.Allow) {
			t.Errorf("step %d: AllowEntries = %d, %v", i, n, err)
		}
	}
}

// TestOptionsRaceReaders changes the options while the stream readers run,
// as a reload does while Caddy logs limited streams; under -race this fails
// if the readers read the options without the filter's lock.
func TestOptionsRaceReaders(t *testing.T) {
	f := loadTest(t, sketch.Config{Limit: 25, Window: time.Second}, loadOptions{})
	if _, _, err := f.objs.Rakelimit.Benchmark(udp("198.51.100.7", 5000).frame(), 10_000, nil); err != nil {
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
		if err := f.SetOptions(Options{TrackShift: uint8(i % 5)}); err != nil {
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
			[]string{"lacks CAP_PERFMON", "setcap cap_bpf,cap_perfmon,cap_net_bind_service+ep",
				"AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_BIND_SERVICE"}},
		{"no capability", memlock, []string{"CAP_BPF", "CAP_PERFMON"},
			[]string{"operation not permitted", "lacks CAP_BPF and CAP_PERFMON", "setcap cap_bpf,cap_perfmon"}},
		{"EPERM with the capabilities", memlock, nil, []string{"operation not permitted", "seccomp"}},
		{"verifier", fmt.Errorf("load program: %w", ve), nil, []string{"verifier rejected it", "prohibited for !root", "DEBUG"}},
		{"other", fmt.Errorf("map create: %w", unix.EINVAL), nil, []string{"invalid argument"}},
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
