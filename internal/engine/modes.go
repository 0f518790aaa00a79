package engine

import (
	"slices"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// The names of the modes a limiter runs in (the rows of modes).
const (
	// ModeAuto runs the first concrete mode that loads and attaches:
	// the BPF filter, else the userspace limiter.
	ModeAuto = "auto"
	// ModeBPF runs the BPF filter, or refuses to start.
	ModeBPF = "bpf"
	// ModeUserspace runs the userspace limiter and never tries BPF.
	ModeUserspace = "userspace"
)

// DefaultMode is the mode of a configuration that names none.
const DefaultMode = ModeAuto

// Mode is one row of the table of modes: what the configuration names, how
// its engine opens, and what the code that reports on an engine switches on.
type Mode struct {
	// Name is the mode's name in the configuration, the metrics and the
	// admin view.
	Name string
	// Doc says in a few words where the mode decides datagrams, as help
	// texts list the modes: "bpf (in the kernel)".
	Doc string
	// Open opens the mode's engine; nil for a chain.
	Open func(decide.Config) (Engine, error)
	// Chain marks a mode that has no engine of its own (auto): it runs
	// the concrete modes in the table's order, the first whose engine
	// opens, and moves on to the next when that engine cannot attach to
	// a socket.
	Chain bool
	// Filters says how a limiter filters in the mode, as the warning of
	// a fallback to it puts it: "rakelimit filters <Filters>, because".
	Filters string
	// Engine names the mode's engine in messages: "the BPF filter".
	Engine string
	// Grant says what gives a process the mode's engine, for the warning
	// of a fallback away from it; empty when nothing can deny it.
	Grant string
	// RefusalsInSocketDrops is true when the engine refuses datagrams
	// before the socket queues them and the kernel counts those refusals
	// among the socket's own drop counter (a socket filter does): the
	// receive queue's overflows are then the socket's drops less the
	// engine's refusals.
	RefusalsInSocketDrops bool
}

// modes is the table of modes, the chains first, then the concrete modes
// in the order a chain tries them. Adding a mode is a row here and its
// engine; validation, the configuration's errors, the fallback order and
// the metrics' help derive from it (a test compares the docs with it).
var modes = []Mode{
	{Name: ModeAuto, Chain: true,
		Doc: "the first of the others that loads and attaches, with one warning that says why when it is not the first"},
	{Name: ModeBPF, Open: OpenKernel, Doc: "in the kernel",
		Filters: "in the kernel, with the BPF socket filter", Engine: "the BPF filter", Grant: KernelGrant,
		RefusalsInSocketDrops: true},
	{Name: ModeUserspace, Open: OpenUserspace, Doc: "in front of quic-go",
		Filters: "in userspace, in front of quic-go", Engine: "the userspace limiter"},
}

// Modes returns the table of modes, a copy.
func Modes() []Mode { return slices.Clone(modes) }

// ModeNamed returns the row of the mode called name, and whether there is
// one.
func ModeNamed(name string) (Mode, bool) {
	i := slices.IndexFunc(modes, func(m Mode) bool { return m.Name == name })
	if i < 0 {
		return Mode{}, false
	}
	return modes[i], true
}

// ValidMode reports whether mode is one of the modes a limiter can be asked
// for.
func ValidMode(mode string) bool {
	_, ok := ModeNamed(mode)
	return ok
}

// ModeChoices lists the modes for an error that says what is wanted:
// "auto, bpf or userspace".
func ModeChoices() string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.Name
	}
	return orList(names)
}

// ModesRunning lists the concrete modes with where each decides, for a help
// text: "bpf (in the kernel) or userspace (in front of quic-go)".
func ModesRunning() string {
	var out []string
	for _, m := range modes {
		if !m.Chain {
			out = append(out, m.Name+" ("+m.Doc+")")
		}
	}
	return orList(out)
}

// orList joins items as a sentence does: "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// Tries returns the concrete modes the mode called name runs, in the order
// it tries them: the mode itself, or a chain's concrete modes.
func Tries(name string) []Mode {
	m, ok := ModeNamed(name)
	switch {
	case !ok:
		return nil
	case !m.Chain:
		return []Mode{m}
	}
	var out []Mode
	for _, c := range modes {
		if !c.Chain {
			out = append(out, c)
		}
	}
	return out
}

// Runs reports whether a limiter asked for the mode called name may run the
// engine of the concrete mode running: the same mode, or one a chain tries.
func Runs(name, running string) bool {
	return slices.ContainsFunc(Tries(name), func(m Mode) bool { return m.Name == running })
}

// fallbacks returns the concrete modes a limiter asked for the mode called
// name moves to, in order, when the engine of the mode running cannot
// attach to a socket: those its chain tries after running; none for a
// concrete mode.
func fallbacks(name, running string) []Mode {
	m, ok := ModeNamed(name)
	if !ok || !m.Chain {
		return nil
	}
	tries := Tries(name)
	i := slices.IndexFunc(tries, func(m Mode) bool { return m.Name == running })
	if i < 0 {
		return nil
	}
	return tries[i+1:]
}

// modeOf returns the row of the concrete mode an engine runs in.
func modeOf(e Engine) Mode {
	m, _ := ModeNamed(e.Mode())
	return m
}
