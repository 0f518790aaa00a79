package rakelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace/prefilter"
)

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

// view is the JSON of GET /rakelimit/.
type view struct {
	Limiters []viewLimiter `json:"limiters"`
}

// viewLimiter describes one limiter.
type viewLimiter struct {
	Name string `json:"name"`
	// Mode is where the limiter decides: bpf (in the kernel) or
	// userspace (in front of quic-go).
	Mode      string   `json:"mode"`
	Listeners []string `json:"listeners"`
	// Config is the configuration in force, with every default filled in;
	// LevelLimits gives each level's limit (0: unlimited).
	Config viewConfig `json:"config"`
	// Counters are packet counts by family ("ipv4", "ipv6", "unknown").
	Counters map[string]viewCounters `json:"counters"`
	// LimitedStreams are the streams with recent drops, the fastest first,
	// at most 20.
	LimitedStreams []viewStream `json:"limited_streams"`
	// LimitedStreamsTotal counts them all.
	LimitedStreamsTotal int `json:"limited_streams_total"`
	// UntrackedDrops estimates the drops of streams not tracked because
	// new streams came faster than 200 a second (a flood from a new source
	// on every packet): they are counted, not listed.
	UntrackedDrops uint64 `json:"untracked_drops"`
	// OpeningTotal is the cap in force on the socket's connection-opening
	// packets.
	OpeningTotal viewOpeningTotal `json:"opening_total"`
	// Verification says whether the limiter verifies what clients send
	// against what the server sent, and what it learned.
	Verification viewVerification `json:"verification"`
	// Prefilter is the userspace mode's kernel pre-filter (absent in the
	// bpf mode).
	Prefilter *viewPrefilter `json:"prefilter,omitempty"`
}

// viewPrefilter is what the kernel pre-filter (classic BPF) of a userspace
// limiter does. Its drops are estimated: classic BPF cannot count.
type viewPrefilter struct {
	Sockets      int  `json:"sockets"`
	Instructions int  `json:"instructions"`
	Streams      int  `json:"streams"`
	Invalid      bool `json:"drops_invalid"`
	// InvalidDroppedEstimated is by reason; StreamDroppedEstimated by
	// class, the packets of limited streams.
	InvalidDroppedEstimated map[string]uint64 `json:"invalid_dropped_estimated"`
	StreamDroppedEstimated  map[string]uint64 `json:"stream_dropped_estimated"`
	// NegotiationDroppedEstimated counts unknown-version datagrams over
	// the Version Negotiation cap; Negotiation is their drop probability
	// in force.
	NegotiationDroppedEstimated uint64  `json:"negotiation_dropped_estimated"`
	Negotiation                 float64 `json:"negotiation_drop_probability"`
	// ShedDroppedEstimated counts long headers shed while the receive
	// queue overflowed; Shed is their drop probability in force.
	ShedDroppedEstimated uint64  `json:"shed_dropped_estimated"`
	Shed                 float64 `json:"shed_drop_probability"`
	Updates              uint64  `json:"updates"`
	AttachErrors         uint64  `json:"attach_errors"`
}

// viewVerification is the state of connection ID verification.
type viewVerification struct {
	On bool `json:"on"`
	// ServerIDs and Peers count what the limiter taught the filter (new
	// and refreshed); OddIDs the server's packets whose connection IDs
	// are not 4 bytes (which turn verification off).
	ServerIDs uint64 `json:"server_ids"`
	Peers     uint64 `json:"peers"`
	OddIDs    uint64 `json:"odd_ids"`
}

// viewOpeningTotal is the opening total in force and, when it follows the
// receive queue, what its last period saw.
type viewOpeningTotal struct {
	Adaptive bool `json:"adaptive"`
	// CapPPS is the cap in packets per second, 0 when lifted.
	CapPPS    uint32  `json:"cap_pps"`
	QueueFill float64 `json:"receive_queue_fill,omitempty"`
	// QueueDrops are the datagrams the socket dropped for want of room
	// in the last period (50 ms).
	QueueDrops uint64  `json:"receive_queue_drops,omitempty"`
	OpenedPPS  float64 `json:"opening_pps,omitempty"`
}

// viewConfig is a limiter's configuration.
type viewConfig struct {
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

// viewCounters are one family's datagram counts.
type viewCounters struct {
	// Classes are the counts of the limiter classes: "opening" and
	// "established", or "all" without classify.
	Classes map[string]viewClassCounters `json:"classes"`
	// Negotiation counts datagrams with a version quic-go lacks: passed,
	// dropped over the cap, or dry_run.
	Negotiation map[string]uint64 `json:"negotiation"`
	// Invalid counts invalid datagrams by reason (dropped), InvalidDryRun
	// those a dry run delivered.
	Invalid       map[string]uint64 `json:"invalid"`
	InvalidDryRun map[string]uint64 `json:"invalid_dry_run"`
	Allowlisted   uint64            `json:"allowlisted"`
	// Verified counts datagrams verified against what the server sent,
	// by how (see the metric caddy_rakelimit_verified_packets_total).
	Verified map[string]uint64 `json:"verified"`
}

// viewClassCounters are one limiter class's counts; the maps are keyed by
// level.
type viewClassCounters struct {
	Passed  uint64            `json:"passed"`
	Limited map[string]uint64 `json:"limited"`
	Dropped map[string]uint64 `json:"dropped"`
	DryRun  map[string]uint64 `json:"dry_run"`
}

// viewStream is a stream with recent drops, or a source of invalid
// datagrams.
type viewStream struct {
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
	v, err := readView()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// readView reads every limiter.
func readView() (view, error) {
	v := view{Limiters: []viewLimiter{}}
	var firstErr error
	limiters.each(func(l *engine.Limiter) {
		al, err := viewOf(l)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("limiter %q: %w", l.Name(), err)
		}
		v.Limiters = append(v.Limiters, al)
	})
	sort.Slice(v.Limiters, func(i, j int) bool { return v.Limiters[i].Name < v.Limiters[j].Name })
	return v, firstErr
}

// viewOf reads one limiter.
func viewOf(l *engine.Limiter) (viewLimiter, error) {
	put, listeners := l.Snapshot()
	set := put.Config
	c := set.Limiter.WithDefaults()
	eng := l.Engine()
	al := viewLimiter{
		Name:      l.Name(),
		Mode:      eng.Mode(),
		Listeners: listeners,
		Config: viewConfig{
			Limit: c.Limit, Window: c.Window.String(), Classify: set.Classify,
			IPv4Prefixes: ints(c.IPv4Prefixes), IPv6Prefixes: ints(c.IPv6Prefixes), PerDestinationPort: c.PerDstPort,
			BlockSourcePorts: portRanges(set.BlockedPorts), VersionNegotiation: set.Negotiation,
			DryRun: set.DryRun, Allow: []string{},
		},
		Counters:       map[string]viewCounters{},
		LimitedStreams: []viewStream{},
	}
	for lvl := range c.Levels() {
		al.Config.LevelLimits = append(al.Config.LevelLimits, engine.LevelLimit(set, 0, lvl))
		al.Config.EstablishedLevelLimits = append(al.Config.EstablishedLevelLimits, engine.LevelLimit(set, 1, lvl))
	}
	for _, p := range set.Allow {
		al.Config.Allow = append(al.Config.Allow, p.String())
	}
	learned := l.Learned()
	al.Verification = viewVerification{On: set.VerifyIDs && !l.VerificationOff(), ServerIDs: learned.IDs,
		Peers: learned.Peers, OddIDs: learned.OddIDs}
	total := l.OpeningTotal()
	al.OpeningTotal = viewOpeningTotal{Adaptive: total.Adaptive, CapPPS: total.Cap, QueueFill: total.Last.Fill,
		QueueDrops: total.Last.Overflows, OpenedPPS: total.Last.OpenedPPS}
	if pf, ok := eng.(engine.Prefiltered); ok {
		ps := pf.Prefilter()
		vp := &viewPrefilter{Sockets: ps.Sockets, Instructions: ps.Instructions, Streams: ps.Rules, Invalid: ps.Stateless,
			InvalidDroppedEstimated: map[string]uint64{}, StreamDroppedEstimated: map[string]uint64{},
			NegotiationDroppedEstimated: ps.NegotiationDropped, Negotiation: ps.Negotiation,
			ShedDroppedEstimated: ps.ShedDropped, Shed: ps.Shed,
			Updates: ps.Updates, AttachErrors: ps.AttachErrors}
		for _, r := range prefilter.Stateless {
			vp.InvalidDroppedEstimated[r.String()] = ps.InvalidDropped[r]
		}
		for _, class := range engine.LimiterClasses {
			vp.StreamDroppedEstimated[engine.ClassName(set, class)] = ps.StreamDropped[class]
		}
		al.Prefilter = vp
	}
	st, err := eng.Stats()
	if err != nil {
		return al, err
	}
	for fam := range decide.Families {
		ac := viewCounters{Classes: map[string]viewClassCounters{}, Allowlisted: st.Allowed[fam],
			Negotiation: map[string]uint64{"passed": st.Negotiation[fam][0], "dropped": st.Negotiation[fam][1],
				"dry_run": st.Negotiation[fam][2]},
			Invalid: map[string]uint64{}, InvalidDryRun: map[string]uint64{}, Verified: map[string]uint64{}}
		for _, class := range engine.LimiterClasses {
			cc := viewClassCounters{Passed: st.Unlimited(int(class), fam),
				Limited: map[string]uint64{}, Dropped: map[string]uint64{}, DryRun: map[string]uint64{}}
			for lvl := range c.Levels() {
				k := strconv.Itoa(lvl)
				cc.Limited[k], cc.Dropped[k], cc.DryRun[k] = st.Limited[class][fam][lvl], st.Dropped[class][fam][lvl],
					st.WouldDrop[class][fam][lvl]
			}
			ac.Classes[engine.ClassName(set, class)] = cc
		}
		for r := quicclass.Reason(1); r < quicclass.NumReasons; r++ {
			ac.Invalid[r.String()], ac.InvalidDryRun[r.String()] = st.Invalid[0][fam][r], st.Invalid[1][fam][r]
		}
		for how := quicclass.Verification(1); how < quicclass.NumVerifications; how++ {
			ac.Verified[how.String()] = st.Verified[fam][how]
		}
		al.Counters[familyNames[fam]] = ac
	}
	streams, err := eng.Streams()
	if err != nil {
		return al, err
	}
	al.LimitedStreamsTotal = len(streams)
	if al.UntrackedDrops, err = eng.Untracked(); err != nil {
		return al, err
	}
	sort.Slice(streams, func(i, j int) bool { return streams[i].Estimate > streams[j].Estimate })
	for _, s := range streams[:min(len(streams), topStreams)] {
		name, rate := l.Describe(s)
		as := viewStream{Stream: name, Class: engine.ClassName(set, s.Class), Level: s.Level, RatePPS: rate,
			Since: s.First, LastDrop: s.Last, Dropped: s.Drops, DryRun: s.DryRun}
		if s.Class == quicclass.Invalid {
			as.Reason, as.Level = s.Reason.String(), -1
		} else {
			as.LimitPPS = engine.LevelLimit(set, int(s.Class), s.Level)
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
