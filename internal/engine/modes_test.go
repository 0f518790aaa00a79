package engine

import (
	"slices"
	"testing"
)

// TestModeTable: validation, the choices an error offers, the help text of
// the metrics, the modes each mode tries and the fallbacks of a failed
// attach all derive from the table of modes.
func TestModeTable(t *testing.T) {
	if got, want := ModeChoices(), "auto, xdp, bpf or userspace"; got != want {
		t.Errorf("ModeChoices() = %q, want %q", got, want)
	}
	if got, want := ModesRunning(), "xdp (at the driver), bpf (in the kernel) or userspace (in front of quic-go)"; got != want {
		t.Errorf("ModesRunning() = %q, want %q", got, want)
	}
	names := func(ms []Mode) []string {
		out := []string{}
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	for _, tt := range []struct {
		mode  string
		valid bool
		// tries are the concrete modes the mode tries, in order, and
		// triesAsked those it tries with options that name XDP
		// interfaces (nil: tries); fallbacks those a failed attach
		// moves to from running.
		tries      []string
		triesAsked []string
		running    string
		fallbacks  []string
	}{
		{mode: ModeAuto, valid: true, tries: []string{ModeBPF, ModeUserspace}, triesAsked: []string{ModeXDP, ModeBPF, ModeUserspace},
			running: ModeXDP, fallbacks: []string{ModeBPF, ModeUserspace}},
		{mode: ModeAuto, valid: true, tries: []string{ModeBPF, ModeUserspace}, triesAsked: []string{ModeXDP, ModeBPF, ModeUserspace},
			running: ModeBPF, fallbacks: []string{ModeUserspace}},
		{mode: ModeAuto, valid: true, tries: []string{ModeBPF, ModeUserspace}, triesAsked: []string{ModeXDP, ModeBPF, ModeUserspace},
			running: ModeUserspace, fallbacks: []string{}},
		{mode: ModeXDP, valid: true, tries: []string{ModeXDP}, running: ModeXDP, fallbacks: []string{}},
		{mode: ModeBPF, valid: true, tries: []string{ModeBPF}, running: ModeBPF, fallbacks: []string{}},
		{mode: ModeUserspace, valid: true, tries: []string{ModeUserspace}, running: ModeUserspace, fallbacks: []string{}},
		{mode: "kernel", tries: []string{}, running: ModeBPF, fallbacks: []string{}},
		{mode: "", tries: []string{}, running: ModeBPF, fallbacks: []string{}},
	} {
		if tt.triesAsked == nil {
			tt.triesAsked = tt.tries
		}
		if got := ValidMode(tt.mode); got != tt.valid {
			t.Errorf("ValidMode(%q) = %v, want %v", tt.mode, got, tt.valid)
		}
		if got := names(TriesWith(tt.mode, Options{})); !slices.Equal(got, tt.tries) {
			t.Errorf("TriesWith(%q, no options) = %v, want %v", tt.mode, got, tt.tries)
		}
		asked := Options{XDPInterfaces: []string{"eth0"}}
		if got := names(TriesWith(tt.mode, asked)); !slices.Equal(got, tt.triesAsked) {
			t.Errorf("TriesWith(%q, %+v) = %v, want %v", tt.mode, asked, got, tt.triesAsked)
		}
		if got := names(Tries(tt.mode)); !slices.Equal(got, tt.triesAsked) {
			t.Errorf("Tries(%q) = %v, want %v", tt.mode, got, tt.triesAsked)
		}
		if got := names(fallbacks(tt.mode, tt.running)); !slices.Equal(got, tt.fallbacks) {
			t.Errorf("fallbacks(%q, %q) = %v, want %v", tt.mode, tt.running, got, tt.fallbacks)
		}
		for _, running := range []string{ModeXDP, ModeBPF, ModeUserspace} {
			if got, want := Runs(tt.mode, running), slices.Contains(tt.triesAsked, running); got != want {
				t.Errorf("Runs(%q, %q) = %v, want %v", tt.mode, running, got, want)
			}
		}
	}
	if !ValidMode(DefaultMode) {
		t.Errorf("the default mode %q is not in the table", DefaultMode)
	}
	for _, m := range Modes() {
		if m.Chain != (m.Open == nil) {
			t.Errorf("mode %s: a chain has no engine of its own, a concrete mode one", m.Name)
		}
		if !m.Chain && (m.Doc == "" || m.Filters == "" || m.Engine == "" || m.AttachesTo == "") {
			t.Errorf("mode %s: a concrete mode says where it decides, how it filters, what its engine is and what it attaches to", m.Name)
		}
	}
}

// TestFallbackMessage: the warning of a fallback names the mode the
// limiter runs in, the engine that could not be used and what would give it.
func TestFallbackMessage(t *testing.T) {
	bpf, _ := ModeNamed(ModeBPF)
	user, _ := ModeNamed(ModeUserspace)
	got := fallbackMessage(user, bpf, "cannot be used here")
	if want := "rakelimit filters in userspace, in front of quic-go, because the BPF filter cannot be used here; " + KernelGrant; got != want {
		t.Errorf("fallbackMessage = %q, want %q", got, want)
	}
}
