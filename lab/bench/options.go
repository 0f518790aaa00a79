//go:build linux

package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Variant is one way of running Caddy: the directive text placed in the site
// block, empty for plain Caddy.
type Variant struct {
	Name      string `json:"name"`
	Directive string `json:"directive"`
}

// Plain is the reference variant: Caddy without the directive.
const Plain = "plain"

// builtinVariants are the variants every run knows.
func builtinVariants() []Variant {
	return []Variant{{Name: Plain}, {Name: "rakelimit", Directive: "rakelimit"}}
}

// GtlsMode says whether to run gtlsclient fetches.
type GtlsMode string

// The gtlsclient modes.
const (
	GtlsAuto    GtlsMode = "auto"    // when installed
	GtlsRequire GtlsMode = "require" // fail when not installed
	GtlsOff     GtlsMode = "off"
)

// Options are the settings of one benchmark run.
type Options struct {
	// Scenarios to run, in order.
	Scenarios []Scenario
	// Variants to run, Plain first.
	Variants []Variant
	// Reps is the number of repetitions of every scenario and variant.
	Reps int
	// Scale multiplies the length of every timed phase: flood scenarios,
	// transfer stall and overall timeouts, the stop timeout.
	Scale float64
	// TransferScale multiplies the sizes of the transfers.
	TransferScale float64
	// CaddyCPUs, when set, is the CPU list (taskset -c) Caddy runs on;
	// run rakebench itself on the other CPUs to keep the two apart.
	CaddyCPUs string
	// Out is the output directory.
	Out string
	// Readme, when set, is a Markdown file whose bench section (between
	// the markers) is replaced with the charts and their provenance.
	Readme string
	// Caddy is a Caddy binary with the module; empty: build ./cmd/caddy.
	Caddy string
	// Port and AdminPort are the site's and the admin endpoint's ports; 0
	// picks free ones.
	Port, AdminPort int
	// Gtls says whether to run gtlsclient.
	Gtls GtlsMode
	// Timeout bounds each legitimate request.
	Timeout time.Duration
	// FloodMax bounds the datagrams of one flood.
	FloodMax uint64
	// From, when set, is a results.json to render again (results.md, the
	// charts, Readme) instead of measuring.
	From string
	// Keep keeps the temporary directory (Caddy's configurations and logs).
	Keep bool
	// Dashboard, when set, is the scenario whose first repetition with
	// DashboardVariant is scraped every second and rendered through the
	// Grafana dashboard's queries into dashboard.svg in Out.
	Dashboard        string
	DashboardVariant string
	// Args is the command line, for the report.
	Args []string
}

// Durations derived from Scale.
func (o *Options) floodDuration() time.Duration { return o.scaled(10 * time.Second) }
func (o *Options) stallTimeout() time.Duration  { return max(2*time.Second, o.scaled(10*time.Second)) }
func (o *Options) transferTimeout() time.Duration {
	return max(10*time.Second, o.scaled(60*time.Second))
}
func (o *Options) stopTimeout() time.Duration { return max(5*time.Second, o.scaled(30*time.Second)) }

// floodStopTimeout bounds the stop after a flood, shorter than after the
// transfers: plain Caddy waits for every half-open connection a flood of
// Initials left (its grace period is eternal), which takes tens of seconds.
func (o *Options) floodStopTimeout() time.Duration {
	return max(2*time.Second, o.scaled(10*time.Second))
}

func (o *Options) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * o.Scale)
}

// variantFlag collects repeated -variant name=directive flags.
type variantFlag []Variant

func (v *variantFlag) String() string { return "" }

var variantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

func (v *variantFlag) Set(s string) error {
	name, directive, ok := strings.Cut(s, "=")
	name, directive = strings.TrimSpace(name), strings.TrimSpace(directive)
	switch {
	case !ok:
		return fmt.Errorf("%q: want name=directive text", s)
	case !variantName.MatchString(name):
		return fmt.Errorf("name %q: want lower-case letters, digits, - and _, at most 32", name)
	case directive == "":
		return fmt.Errorf("%q: empty directive (the plain variant is built in)", name)
	case strings.Count(directive, "{") != strings.Count(directive, "}"):
		return fmt.Errorf("%q: unbalanced braces in %q", name, directive)
	}
	for _, b := range builtinVariants() {
		if b.Name == name {
			return fmt.Errorf("%q is built in", name)
		}
	}
	for _, x := range *v {
		if x.Name == name {
			return fmt.Errorf("%q given twice", name)
		}
	}
	*v = append(*v, Variant{Name: name, Directive: expandBlock(directive)})
	return nil
}

// expandBlock turns a one-line block, "rakelimit { limit 500; window 2s }",
// into the lines a Caddyfile needs; ";" separates the block's lines. Other
// text is returned as it is.
func expandBlock(d string) string {
	i := strings.Index(d, " { ")
	if strings.Contains(d, "\n") || i < 0 || !strings.HasSuffix(d, " }") {
		return d
	}
	var b strings.Builder
	b.WriteString(d[:i] + " {\n")
	for line := range strings.SplitSeq(d[i+3:len(d)-2], ";") {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString("\t" + line + "\n")
		}
	}
	b.WriteString("}")
	return b.String()
}

// cpuList is a CPU list as taskset -c takes it.
var cpuList = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

// ParseFlags parses the command line (without the program name). It returns
// flag.ErrHelp after printing the usage for -h.
func ParseFlags(args []string, stderr io.Writer) (*Options, error) {
	fs := flag.NewFlagSet("rakebench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var extra variantFlag
	scenarios := fs.String("scenarios", "all", "comma-separated scenarios to run, or all: "+strings.Join(ScenarioNames(), ", "))
	variants := fs.String("variants", "all", "comma-separated variants to run, or all (plain always runs: it is the reference)")
	fs.Var(&extra, "variant", "an extra variant, name=directive text placed in the site block (repeatable), e.g.\n'strict=rakelimit 200' or 'slow=rakelimit { limit 500; window 2s }' (; separates a one-line block's lines)")
	o := &Options{}
	fs.IntVar(&o.Reps, "reps", 3, "repetitions of every scenario and variant")
	fs.Float64Var(&o.Scale, "scale", 1, "multiplies every timed phase (flood scenarios last 10s x scale)")
	fs.Float64Var(&o.TransferScale, "transfer-scale", 1, "multiplies the transfer sizes (200 MB, 100 MB, 20 x 10 MB)")
	fs.StringVar(&o.CaddyCPUs, "caddy-cpus", "", "the CPUs Caddy runs on (a taskset -c list, e.g. 1), with rakebench itself run on the others\n"+
		"(taskset -c 0 rakebench ...): the clients and Caddy then take no CPU from each other (default: no pinning)")
	fs.StringVar(&o.Out, "out", "lab/docs/bench", "output directory for results.md, results.json and the charts")
	fs.StringVar(&o.Readme, "readme", "", "Markdown file whose bench section (between <!-- bench:begin --> and <!-- bench:end -->) to rewrite")
	fs.StringVar(&o.Caddy, "caddy", "", "Caddy binary with the module (default: build ./cmd/caddy)")
	fs.IntVar(&o.Port, "port", 0, "the site's port, TCP and UDP (default: a free one)")
	fs.IntVar(&o.AdminPort, "admin-port", 0, "Caddy's admin port (default: a free one)")
	gtls := fs.String("gtlsclient", string(GtlsAuto), "gtlsclient fetches: auto (when installed), require, off")
	fs.DurationVar(&o.Timeout, "timeout", 3*time.Second, "timeout of each legitimate request")
	fs.StringVar(&o.From, "from", "", "render results.md, the charts and -readme again from this results.json, without measuring")
	fs.BoolVar(&o.Keep, "keep", false, "keep the temporary directory with Caddy's configurations and logs, and print its path")
	fs.Uint64Var(&o.FloodMax, "flood-max", 20_000_000, "most datagrams one flood sends")
	dashboard := fs.String("dashboard", "", "SCENARIO[/VARIANT]: scrape Caddy's /metrics every second during that scenario's first repetition\n"+
		"with VARIANT (default rakelimit) and render "+DashboardFile+"'s panels from the scrapes into dashboard.svg in -out")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: rakebench [flags]")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, fmt.Errorf("%w (rakebench -h lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (rakebench -h lists the flags)", fs.Arg(0))
	}
	o.Args = append([]string{"rakebench"}, args...)
	var err error
	if o.Scenarios, err = selectScenarios(*scenarios); err != nil {
		return nil, err
	}
	if o.Variants, err = selectVariants(*variants, extra); err != nil {
		return nil, err
	}
	switch {
	case o.Reps < 1 || o.Reps > 100:
		return nil, fmt.Errorf("-reps %d: want 1 to 100", o.Reps)
	case o.Scale < 0.05 || o.Scale > 100:
		return nil, fmt.Errorf("-scale %v: want 0.05 to 100", o.Scale)
	case o.TransferScale < 0.001 || o.TransferScale > 100:
		return nil, fmt.Errorf("-transfer-scale %v: want 0.001 to 100", o.TransferScale)
	case o.CaddyCPUs != "" && !cpuList.MatchString(o.CaddyCPUs):
		return nil, fmt.Errorf("-caddy-cpus %q: want a CPU list such as 1 or 2-3,5", o.CaddyCPUs)
	case o.Out == "":
		return nil, errors.New("-out: empty directory")
	case o.Timeout < 100*time.Millisecond || o.Timeout > time.Minute:
		return nil, fmt.Errorf("-timeout %v: want 100ms to 1m", o.Timeout)
	case o.FloodMax < 1:
		return nil, errors.New("-flood-max 0: want at least 1")
	}
	for _, p := range []struct {
		name string
		port int
	}{{"-port", o.Port}, {"-admin-port", o.AdminPort}} {
		if p.port < 0 || p.port > 65535 {
			return nil, fmt.Errorf("%s %d: want 1 to 65535", p.name, p.port)
		}
	}
	if o.Port != 0 && o.Port == o.AdminPort {
		return nil, fmt.Errorf("-port and -admin-port are both %d", o.Port)
	}
	if o.Dashboard, o.DashboardVariant, err = selectDashboard(*dashboard, o); err != nil {
		return nil, err
	}
	switch g := GtlsMode(*gtls); g {
	case GtlsAuto, GtlsRequire, GtlsOff:
		o.Gtls = g
	default:
		return nil, fmt.Errorf("-gtlsclient %q: want auto, require or off", *gtls)
	}
	return o, nil
}

// selectScenarios resolves a comma-separated list of scenario names.
func selectScenarios(list string) ([]Scenario, error) {
	all := Scenarios()
	if strings.TrimSpace(list) == "all" {
		return all, nil
	}
	var out []Scenario
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q: want all or some of %s", name, strings.Join(ScenarioNames(), ", "))
		}
		if !slices.ContainsFunc(out, func(s Scenario) bool { return s.Name == name }) {
			out = append(out, all[i])
		}
	}
	return out, nil
}

// selectDashboard resolves the -dashboard flag, SCENARIO[/VARIANT], against
// the selected scenarios and variants; empty: no dashboard.
func selectDashboard(flagValue string, o *Options) (string, string, error) {
	if flagValue == "" {
		return "", "", nil
	}
	scenario, variant, ok := strings.Cut(flagValue, "/")
	if !ok {
		variant = "rakelimit"
	}
	switch {
	case o.From != "":
		return "", "", fmt.Errorf("-dashboard %s: needs a measuring run, not -from (the scrapes are not in results.json)", flagValue)
	case !slices.ContainsFunc(o.Scenarios, func(s Scenario) bool { return s.Name == scenario }):
		return "", "", fmt.Errorf("-dashboard %s: scenario %q is not among the scenarios run", flagValue, scenario)
	case variant == Plain:
		return "", "", fmt.Errorf("-dashboard %s: plain Caddy exports no rakelimit metrics: name a variant with the directive", flagValue)
	case !slices.ContainsFunc(o.Variants, func(v Variant) bool { return v.Name == variant }):
		return "", "", fmt.Errorf("-dashboard %s: variant %q is not among the variants run", flagValue, variant)
	}
	return scenario, variant, nil
}

// selectVariants resolves the -variants list against the built-in and extra
// variants, with plain first and always present.
func selectVariants(list string, extra []Variant) ([]Variant, error) {
	known := append(builtinVariants(), extra...)
	if strings.TrimSpace(list) == "all" {
		return known, nil
	}
	var names []string
	for _, v := range known {
		names = append(names, v.Name)
	}
	out := []Variant{known[0]}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(known, func(v Variant) bool { return v.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("-variants: unknown variant %q: want all or some of %s (add one with -variant name=directive)",
				name, strings.Join(names, ", "))
		}
		if !slices.ContainsFunc(out, func(v Variant) bool { return v.Name == name }) {
			out = append(out, known[i])
		}
	}
	return out, nil
}

// checkPortFree returns an error naming the flag when port cannot be bound on
// every loopback address for TCP (and UDP when udp is set).
func checkPortFree(flagName string, port int, udp bool) error {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("%s %d: port in use (tcp): %w", flagName, port, err)
	}
	l.Close()
	if udp {
		u, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
		if err != nil {
			return fmt.Errorf("%s %d: port in use (udp): %w", flagName, port, err)
		}
		u.Close()
	}
	return nil
}

// freePort returns a port free for both TCP and UDP on every address,
// different from the ports in avoid.
func freePort(avoid ...int) (int, error) {
	for range 100 {
		u, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		u.Close()
		if err != nil {
			continue
		}
		l.Close()
		if !slices.Contains(avoid, port) {
			return port, nil
		}
	}
	return 0, errors.New("finding a free port: none after 100 tries")
}
