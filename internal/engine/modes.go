package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// The names of the modes a limiter runs in (the rows of modes).
const (
	// ModeAuto runs the first concrete mode that loads and attaches:
	// the XDP program when the options name its interfaces, the BPF
	// filter, else the userspace limiter.
	ModeAuto = "auto"
	// ModeXDP runs the XDP program on the interfaces that carry the
	// listeners' traffic, with the BPF filter on the sockets, or refuses
	// to start.
	ModeXDP = "xdp"
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
	Open func(decide.Config, Options) (Engine, error)
	// Chain marks a mode that has no engine of its own (auto): it runs
	// the concrete modes in the table's order, the first whose engine
	// opens, and moves on to the next when that engine cannot attach to
	// a socket.
	Chain bool
	// Asked, when set, says whether a chain tries the mode with the
	// options given: a mode that takes over more than the process (the
	// XDP program, a network interface) only when the options ask.
	Asked func(Options) bool
	// TakesOptions is true for the mode whose engine reads Options (where
	// the XDP program runs): options set need a mode that tries it
	// (CheckOptions).
	TakesOptions bool
	// AttachesTo says what the engine attaches to, as the warning of a
	// fallback away from it puts it: "cannot attach to <AttachesTo>".
	AttachesTo string
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
	// engine's refusals. Not so for the XDP program, whose refusals never
	// reach the socket, counted with its socket filter's: the socket's
	// drops are its overflows then, and the socket filter's refusals of
	// what arrives on loopback, which count as overflows too.
	RefusalsInSocketDrops bool
}

// modes is the table of modes, the chains first, then the concrete modes
// in the order a chain tries them. Adding a mode is a row here and its
// engine; validation, the configuration's errors, the fallback order and
// the metrics' help derive from it (a test compares the docs with it).
var modes = []Mode{
	{Name: ModeAuto, Chain: true,
		Doc: "the first of the others that loads and attaches, with one warning that says why when it is not the first"},
	{Name: ModeXDP, Open: OpenXDP, Doc: "at the driver", Asked: Options.AsksXDP, TakesOptions: true,
		Filters: "at the driver, with the XDP program", Engine: "the XDP program", Grant: XDPGrant,
		AttachesTo: "the listener's interfaces"},
	{Name: ModeBPF, Open: OpenKernel, Doc: "in the kernel",
		Filters: "in the kernel, with the BPF socket filter", Engine: "the BPF filter", Grant: KernelGrant,
		AttachesTo: "the socket", RefusalsInSocketDrops: true},
	{Name: ModeUserspace, Open: OpenUserspace, Doc: "in front of quic-go",
		Filters: "in userspace, in front of quic-go", Engine: "the userspace limiter", AttachesTo: "the socket"},
}

// Options are what opens a limiter's engine besides its decision
// configuration: where the XDP program runs. They change only with a
// restart, as the mode does.
type Options struct {
	// XDPInterfaces names the interfaces the XDP program runs on;
	// empty, those that hold a listener's address (for a wildcard
	// listener, every interface that is up but loopback). Naming them
	// makes mode auto try XDP first.
	XDPInterfaces []string
	// XDPGeneric runs the XDP program in generic mode, after the kernel
	// has allocated the packet, for drivers without native XDP.
	XDPGeneric bool
	// HashKey is the engine's hash key, nil for a fresh random one. It is
	// not a setting (Equal leaves it out): a fallback opens the new engine
	// on the old one's key, so that the server IDs and peers the old one
	// learned, which its sets hold hashed under that key, are found.
	HashKey *sketch.HashKey
}

// CheckOptions reports why o cannot go with the mode called name, a valid
// one, or nil: options set need a mode that tries the mode that takes them
// (Mode.TakesOptions), and in a chain that tries it only when asked
// (Mode.Asked), options that ask for it.
func CheckOptions(name string, o Options) error {
	if len(o.XDPInterfaces) == 0 && !o.XDPGeneric {
		return nil
	}
	takes := func(m Mode) bool { return m.TakesOptions }
	if !slices.ContainsFunc(Tries(name), takes) {
		var concrete, chains []string
		for _, m := range modes {
			switch {
			case !slices.ContainsFunc(Tries(m.Name), takes):
			case m.Chain:
				chains = append(chains, m.Name)
			default:
				concrete = append(concrete, m.Name)
			}
		}
		return fmt.Errorf("xdp_interfaces and xdp_generic need mode %s (or %s), and mode is %s",
			orList(concrete), orList(chains), name)
	}
	if !slices.ContainsFunc(TriesWith(name, o), takes) {
		return fmt.Errorf("xdp_generic in mode %s needs xdp_interfaces: mode %s tries the XDP program only on "+
			"the interfaces named", name, name)
	}
	return nil
}

// AsksXDP reports whether the options ask a chain (mode auto) to try the
// XDP program: they name its interfaces.
func (o Options) AsksXDP() bool { return len(o.XDPInterfaces) > 0 }

// Equal reports whether two options open the same engine.
func (o Options) Equal(p Options) bool {
	return slices.Equal(o.XDPInterfaces, p.XDPInterfaces) && o.XDPGeneric == p.XDPGeneric
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

// ModeNames lists the modes' names in the table's order.
func ModeNames() []string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.Name
	}
	return names
}

// ModeChoices lists the modes for an error that says what is wanted:
// "auto, xdp, bpf or userspace".
func ModeChoices() string { return orList(ModeNames()) }

// ModesRunning lists the concrete modes with where each decides, for a help
// text: "xdp (at the driver), bpf (in the kernel) or userspace (in front of
// quic-go)".
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
// it tries them: the mode itself, or a chain's concrete modes (those it
// tries only when asked among them: see TriesWith).
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

// TriesWith returns the concrete modes the mode called name runs with the
// options o, in the order it tries them: those of Tries, less a chain's
// modes that o does not ask for (Mode.Asked).
func TriesWith(name string, o Options) []Mode {
	tries := Tries(name)
	if m, ok := ModeNamed(name); !ok || !m.Chain {
		return tries
	}
	return slices.DeleteFunc(tries, func(m Mode) bool { return m.Asked != nil && !m.Asked(o) })
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
