package report

import (
	"fmt"
	"strconv"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// Config is a limiter's configuration in force, as ConfigOf reads it: its
// keys are the options' JSON names (the root package's tests check them
// against the option table), but for the unverified class's level limits,
// which have no option.
type Config struct {
	Limit    uint32   `json:"limit"`
	Window   Duration `json:"window"`
	Classify bool     `json:"classify"`
	// LevelLimits gives each level's limit of connection-opening packets
	// (of every datagram without classify), EstablishedLevelLimits that of
	// established connections, UnverifiedLevelLimits that of unverified
	// short headers; 0 is unlimited.
	LevelLimits            []uint32 `json:"level_limits"`
	EstablishedLevelLimits []uint32 `json:"established_level_limits"`
	UnverifiedLevelLimits  []uint32 `json:"unverified_level_limits"`
	IPv4Prefixes           []int    `json:"ipv4_prefixes"`
	IPv6Prefixes           []int    `json:"ipv6_prefixes"`
	PerDestinationPort     bool     `json:"per_destination_port"`
	// BlockSourcePorts lists the blocked source ports as ranges.
	BlockSourcePorts   []string `json:"block_source_ports"`
	VersionNegotiation uint32   `json:"version_negotiation"`
	DryRun             bool     `json:"dry_run"`
	// Allow lists the allowlisted prefixes; the log line that describes
	// a limiter gives their count (the tag log: a name and "count").
	Allow []string `json:"allow" log:"allowlisted_prefixes,count"`
}

// OpeningClass names the class of connection-opening packets as the
// counters do: ClassOpening, or ClassAll without classify.
func (c Config) OpeningClass() string {
	if !c.Classify {
		return ClassAll
	}
	return ClassOpening
}

// ClassLimits are one limiter class's limits by level; 0 is unlimited.
type ClassLimits struct {
	Class  string
	Levels []uint32
}

// Limits are the limits of each limiter class, named as the counters name
// the classes, in the order of the classes: opening (or all), established,
// unverified.
func (c Config) Limits() []ClassLimits {
	return []ClassLimits{{c.OpeningClass(), c.LevelLimits}, {ClassEstablished, c.EstablishedLevelLimits},
		{ClassUnverified, c.UnverifiedLevelLimits}}
}

// ConfigOf is c as every view shows it, every default filled in: the one
// conversion of a decision configuration for the admin API, the metrics,
// the console and the log line that describes a limiter (engine's
// SettingsFields reads its fields). A setting that shows is a field of
// Config and a line here.
func ConfigOf(c decide.Config) Config {
	lc := c.Limiter.WithDefaults()
	r := Config{
		Limit: lc.Limit, Window: Duration(lc.Window), Classify: c.Classify,
		IPv4Prefixes: ints(lc.IPv4Prefixes), IPv6Prefixes: ints(lc.IPv6Prefixes), PerDestinationPort: lc.PerDstPort,
		BlockSourcePorts: portRanges(c.BlockedPorts), VersionNegotiation: c.Negotiation,
		DryRun: c.DryRun, Allow: []string{},
	}
	for lvl := range lc.Levels() {
		r.LevelLimits = append(r.LevelLimits, c.LevelLimit(int(quicclass.Opening), lvl))
		r.EstablishedLevelLimits = append(r.EstablishedLevelLimits, c.LevelLimit(int(quicclass.Established), lvl))
		r.UnverifiedLevelLimits = append(r.UnverifiedLevelLimits, c.LevelLimit(int(quicclass.Unverified), lvl))
	}
	for _, p := range c.Allow {
		r.Allow = append(r.Allow, p.String())
	}
	return r
}

// portRanges lists a port set as ranges, "0-1023", "1900".
func portRanges(ports *quicclass.Ports) []string {
	out := []string{}
	for _, r := range ports.Ranges() {
		if r[0] == r[1] {
			out = append(out, strconv.Itoa(int(r[0])))
		} else {
			out = append(out, strconv.Itoa(int(r[0]))+"-"+strconv.Itoa(int(r[1])))
		}
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

// Duration is a time.Duration that JSON holds as its string: "1s",
// "1m30s".
type Duration time.Duration

// String is the duration as time.Duration writes it.
func (d Duration) String() string { return time.Duration(d).String() }

// Seconds is the duration in seconds.
func (d Duration) Seconds() float64 { return time.Duration(d).Seconds() }

// MarshalText writes the duration as its string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration that String wrote.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("reading a duration: %w", err)
	}
	*d = Duration(v)
	return nil
}
