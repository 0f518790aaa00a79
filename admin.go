//go:build linux

package rakelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/bpf"
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
	Name      string   `json:"name"`
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
	Limit              uint32   `json:"limit"`
	Window             string   `json:"window"`
	LevelLimits        []uint32 `json:"level_limits"`
	IPv4Prefixes       []int    `json:"ipv4_prefixes"`
	IPv6Prefixes       []int    `json:"ipv6_prefixes"`
	PerDestinationPort bool     `json:"per_destination_port"`
	DryRun             bool     `json:"dry_run"`
	Allow              []string `json:"allow"`
}

// AdminCounters are one family's packet counts; the maps are keyed by level.
type AdminCounters struct {
	Passed      uint64            `json:"passed"`
	Limited     map[string]uint64 `json:"limited"`
	Dropped     map[string]uint64 `json:"dropped"`
	DryRun      map[string]uint64 `json:"dry_run"`
	Allowlisted uint64            `json:"allowlisted"`
}

// AdminStream is a stream with recent drops.
type AdminStream struct {
	// Stream names the generalisation that drops it, e.g.
	// "198.51.100.0/24 sport=* -> :443".
	Stream   string    `json:"stream"`
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
	al := AdminLimiter{
		Name:      l.name,
		Listeners: listeners,
		Config: AdminConfig{
			Limit: c.Limit, Window: c.Window.String(), IPv4Prefixes: ints(c.IPv4Prefixes), IPv6Prefixes: ints(c.IPv6Prefixes),
			PerDestinationPort: c.PerDstPort, DryRun: set.DryRun, Allow: []string{},
		},
		Counters:       map[string]AdminCounters{},
		LimitedStreams: []AdminStream{},
	}
	for lvl := range c.Levels() {
		al.Config.LevelLimits = append(al.Config.LevelLimits, levelLimit(set, lvl))
	}
	for _, p := range set.Allow {
		al.Config.Allow = append(al.Config.Allow, p.String())
	}
	st, err := l.filter.Stats()
	if err != nil {
		return al, err
	}
	for fam := range bpf.Families {
		ac := AdminCounters{Passed: st.Unlimited(fam), Allowlisted: st.Allowed[fam],
			Limited: map[string]uint64{}, Dropped: map[string]uint64{}, DryRun: map[string]uint64{}}
		for lvl := range c.Levels() {
			k := strconv.Itoa(lvl)
			ac.Limited[k], ac.Dropped[k], ac.DryRun[k] = st.Limited[fam][lvl], st.Dropped[fam][lvl], st.WouldDrop[fam][lvl]
		}
		al.Counters[familyNames[fam]] = ac
	}
	streams, err := l.filter.Streams()
	if err != nil {
		return al, err
	}
	al.LimitedStreamsTotal = len(streams)
	sort.Slice(streams, func(i, j int) bool { return streams[i].Estimate > streams[j].Estimate })
	for _, s := range streams[:min(len(streams), topStreams)] {
		name, rate := l.describe(s)
		al.LimitedStreams = append(al.LimitedStreams, AdminStream{
			Stream: name, Level: s.Level, RatePPS: rate, LimitPPS: levelLimit(set, s.Level),
			Since: s.First, LastDrop: s.Last, Dropped: s.Drops, DryRun: s.DryRun,
		})
	}
	return al, nil
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
