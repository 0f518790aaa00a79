package rakelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/quicclass"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin serves GET /rakelimit/ on Caddy's admin endpoint: every limiter,
// the listeners it protects, its settings, its counters and the streams it
// limits now, the fastest first. It has nothing to configure.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rakelimit",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rakelimit/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// topStreams is how many limited streams the admin view lists per limiter.
const topStreams = 20

// AdminView is the JSON of GET /rakelimit/.
type AdminView struct {
	Limiters []AdminLimiter `json:"limiters"`
}

// AdminLimiter describes one limiter.
type AdminLimiter struct {
	Name string `json:"name"`
	// Mode is where the limiter decides: bpf (in the kernel) or
	// userspace (in front of quic-go).
	Mode      string   `json:"mode"`
	Listeners []string `json:"listeners"`
	// Config is the configuration in force, with every default filled in;
	// LevelLimits gives each level's limit (0: unlimited).
	Config AdminConfig `json:"config"`
	// Counters are packet counts by family ("ipv4", "ipv6", "unknown").
	Counters map[string]AdminCounters `json:"counters"`
	// LimitedStreams are the streams with recent drops, the fastest first,
	// at most 20.
	LimitedStreams []AdminStream `json:"limited_streams"`
	// LimitedStreamsTotal counts them all.
	LimitedStreamsTotal int `json:"limited_streams_total"`
}

// AdminConfig is a limiter's configuration.
type AdminConfig struct {
	Limit    uint32 `json:"limit"`
	Window   string `json:"window"`
	Classify bool   `json:"classify"`
	// LevelLimits gives each level's limit of connection-opening packets
	// (of every datagram without classify), EstablishedLevelLimits that of
	// established connections; 0 is unlimited.
	LevelLimits            []uint32 `json:"level_limits"`
	EstablishedLevelLimits []uint32 `json:"established_level_limits"`
	IPv4Prefixes           []int    `json:"ipv4_prefixes"`
	IPv6Prefixes           []int    `json:"ipv6_prefixes"`
	PerDestinationPort     bool     `json:"per_destination_port"`
	// BlockSourcePorts lists the blocked source ports as ranges.
	BlockSourcePorts   []string `json:"block_source_ports"`
	VersionNegotiation uint32   `json:"version_negotiation"`
	DryRun             bool     `json:"dry_run"`
	Allow              []string `json:"allow"`
}

// AdminCounters are one family's datagram counts.
type AdminCounters struct {
	// Classes are the counts of the limiter classes: "opening" and
	// "established", or "all" without classify.
	Classes map[string]AdminClassCounters `json:"classes"`
	// Negotiation counts datagrams with a version quic-go lacks: passed,
	// dropped over the cap, or dry_run.
	Negotiation map[string]uint64 `json:"negotiation"`
	// Invalid counts invalid datagrams by reason (dropped), InvalidDryRun
	// those a dry run delivered.
	Invalid       map[string]uint64 `json:"invalid"`
	InvalidDryRun map[string]uint64 `json:"invalid_dry_run"`
	Allowlisted   uint64            `json:"allowlisted"`
}

// AdminClassCounters are one limiter class's counts; the maps are keyed by
// level.
type AdminClassCounters struct {
	Passed  uint64            `json:"passed"`
	Limited map[string]uint64 `json:"limited"`
	Dropped map[string]uint64 `json:"dropped"`
	DryRun  map[string]uint64 `json:"dry_run"`
}

// AdminStream is a stream with recent drops, or a source of invalid
// datagrams.
type AdminStream struct {
	// Stream names the generalisation that drops it, e.g.
	// "198.51.100.0/24 sport=* -> :443", or the source of invalid
	// datagrams, "198.51.100.7 -> :443".
	Stream string `json:"stream"`
	// Class is opening, established, all or invalid; Reason says why
	// invalid datagrams are.
	Class  string `json:"class"`
	Reason string `json:"reason,omitempty"`
	// Level, RatePPS and LimitPPS: the lattice level that drops the
	// stream, its estimated rate and the level's limit (not for invalid
	// datagrams).
	Level    int       `json:"level"`
	RatePPS  float64   `json:"rate_pps"`
	LimitPPS uint32    `json:"limit_pps"`
	Since    time.Time `json:"since"`
	LastDrop time.Time `json:"last_drop"`
	// Dropped estimates the packets dropped since Since (sampled).
	Dropped uint64 `json:"dropped"`
	DryRun  bool   `json:"dry_run"`
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	view, err := adminView()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(view)
}

// adminView reads every limiter.
func adminView() (AdminView, error) {
	view := AdminView{Limiters: []AdminLimiter{}}
	var firstErr error
	limiters.each(func(l *limiter) {
		al, err := l.adminView()
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("limiter %q: %w", l.name, err)
		}
		view.Limiters = append(view.Limiters, al)
	})
	sort.Slice(view.Limiters, func(i, j int) bool { return view.Limiters[i].Name < view.Limiters[j].Name })
	return view, firstErr
}

func (l *limiter) adminView() (AdminLimiter, error) {
	set, _, listeners := l.snapshot()
	c := set.Limiter.WithDefaults()
	eng := l.engine()
	al := AdminLimiter{
		Name:      l.name,
		Mode:      eng.mode(),
		Listeners: listeners,
		Config: AdminConfig{
			Limit: c.Limit, Window: c.Window.String(), Classify: set.Classify,
			IPv4Prefixes: ints(c.IPv4Prefixes), IPv6Prefixes: ints(c.IPv6Prefixes), PerDestinationPort: c.PerDstPort,
			BlockSourcePorts: portRanges(set.BlockedPorts), VersionNegotiation: set.Negotiation,
			DryRun: set.DryRun, Allow: []string{},
		},
		Counters:       map[string]AdminCounters{},
		LimitedStreams: []AdminStream{},
	}
	for lvl := range c.Levels() {
		al.Config.LevelLimits = append(al.Config.LevelLimits, levelLimit(set, 0, lvl))
		al.Config.EstablishedLevelLimits = append(al.Config.EstablishedLevelLimits, levelLimit(set, 1, lvl))
	}
	for _, p := range set.Allow {
		al.Config.Allow = append(al.Config.Allow, p.String())
	}
	st, err := eng.Stats()
	if err != nil {
		return al, err
	}
	for fam := range datagram.Families {
		ac := AdminCounters{Classes: map[string]AdminClassCounters{}, Allowlisted: st.Allowed[fam],
			Negotiation: map[string]uint64{"passed": st.Negotiation[fam][0], "dropped": st.Negotiation[fam][1],
				"dry_run": st.Negotiation[fam][2]},
			Invalid: map[string]uint64{}, InvalidDryRun: map[string]uint64{}}
		for _, class := range limiterClasses {
			cc := AdminClassCounters{Passed: st.Unlimited(int(class), fam),
				Limited: map[string]uint64{}, Dropped: map[string]uint64{}, DryRun: map[string]uint64{}}
			for lvl := range c.Levels() {
				k := strconv.Itoa(lvl)
				cc.Limited[k], cc.Dropped[k], cc.DryRun[k] = st.Limited[class][fam][lvl], st.Dropped[class][fam][lvl],
					st.WouldDrop[class][fam][lvl]
			}
			ac.Classes[className(set, class)] = cc
		}
		for r := quicclass.Reason(1); r < quicclass.NumReasons; r++ {
			ac.Invalid[r.String()], ac.InvalidDryRun[r.String()] = st.Invalid[0][fam][r], st.Invalid[1][fam][r]
		}
		al.Counters[familyNames[fam]] = ac
	}
	streams, err := eng.Streams()
	if err != nil {
		return al, err
	}
	al.LimitedStreamsTotal = len(streams)
	sort.Slice(streams, func(i, j int) bool { return streams[i].Estimate > streams[j].Estimate })
	for _, s := range streams[:min(len(streams), topStreams)] {
		name, rate := l.describe(s)
		as := AdminStream{Stream: name, Class: className(set, s.Class), Level: s.Level, RatePPS: rate,
			Since: s.First, LastDrop: s.Last, Dropped: s.Drops, DryRun: s.DryRun}
		if s.Class == quicclass.Invalid {
			as.Reason, as.Level = s.Reason.String(), -1
		} else {
			as.LimitPPS = levelLimit(set, int(s.Class), s.Level)
		}
		al.LimitedStreams = append(al.LimitedStreams, as)
	}
	return al, nil
}

// portRanges lists a port set as ranges, "0-1023", "1900".
func portRanges(ports *quicclass.Ports) []string {
	out := []string{}
	if ports == nil {
		return out
	}
	for p := 0; p < 65536; p++ {
		if !ports.Has(uint16(p)) {
			continue
		}
		q := p
		for q+1 < 65536 && ports.Has(uint16(q+1)) {
			q++
		}
		if q == p {
			out = append(out, strconv.Itoa(p))
		} else {
			out = append(out, strconv.Itoa(p)+"-"+strconv.Itoa(q))
		}
		p = q
	}
	return out
}

// ints widens prefix lengths for JSON, which would encode []uint8 as base64.
func ints(b []uint8) []int {
	out := make([]int, len(b))
	for i, v := range b {
		out[i] = int(v)
	}
	return out
}

// Interface guards
var (
	_ caddy.AdminRouter = (*Admin)(nil)
)
