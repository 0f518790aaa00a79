package report

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// full is a view with every field set.
func full() View {
	return View{Limiters: []Limiter{{
		Name: "default", Mode: "xdp", Listeners: []string{"[::]:443"},
		XDP: []XDPInterface{{Name: "eth0", Attach: XDPNative, Listeners: []string{"[::]:443"}}},
		Config: Config{Limit: 1000, Window: Duration(1500 * time.Millisecond), Classify: true, LevelLimits: []uint32{1, 2},
			EstablishedLevelLimits: []uint32{3, 0}, UnverifiedLevelLimits: []uint32{4, 5}, IPv4Prefixes: []int{32, 0},
			IPv6Prefixes: []int{64, 0}, PerDestinationPort: true, BlockSourcePorts: []string{"0-1023"}, VersionNegotiation: 10,
			DryRun: true, Allow: []string{"192.0.2.0/24"}},
		Counters: map[string]Counters{"ipv4": {Classes: map[string]ClassCounters{"opening": {Passed: 7,
			Limited: map[string]uint64{"0": 1}, Dropped: map[string]uint64{"0": 2}, DryRun: map[string]uint64{"0": 3}}},
			Negotiation: map[string]uint64{"passed": 1}, Invalid: map[string]uint64{"empty": 1},
			InvalidDryRun: map[string]uint64{"empty": 2}, Allowlisted: 4, Verified: map[string]uint64{"short_by_id": 5}}},
		LimitedStreams: []Stream{{Stream: "127.0.0.6/32 sport=1 -> :443", Class: "invalid", Reason: "empty", Level: -1, RatePPS: 5,
			LimitPPS: 1000, Since: time.Unix(1, 0).UTC(), LastDrop: time.Unix(2, 0).UTC(), Dropped: 9, DryRun: true}},
		LimitedStreamsTotal: 1,
		UntrackedDrops:      6,
		OpeningTotal:        Total{Adaptive: true, CapPPS: 20000, QueueFill: 0.5, QueueDrops: 3, PassedPPS: 9},
		EstablishedTotal:    Total{Adaptive: true, CapPPS: 300000, QueueFill: 0.5, QueueDrops: 3, PassedPPS: 9},
		Verification:        Verification{On: true, ServerIDs: 1, Peers: 2, OddIDs: 3, Proofs: 4, Held: map[string]int{"server_ids": 1}},
		AttachErrors:        2,
		Prefilter: &Prefilter{Sockets: 1, Instructions: 2, Streams: 3, Invalid: true,
			InvalidDroppedEstimated: map[string]uint64{"empty": 1}, StreamDroppedEstimated: map[string]uint64{"opening": 2},
			NegotiationDroppedEstimated: 3, Negotiation: 0.5, ShedDroppedEstimated: 4, Shed: 0.25, Updates: 5, AttachErrors: 6},
	}}}
}

// paths lists the object keys of a JSON value, as dotted paths; the keys
// of maps keyed by family, class, level, reason, verdict or learned set are
// left out, and those of the configuration, which are the options' names
// (the root package's TestReportNamesOptions checks them against the table
// of options), are one path, config.*.
func paths(prefix string, v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			p := prefix + "." + k
			if prefix == "" {
				p = k
			}
			switch {
			case strings.HasSuffix(prefix, "counters"), strings.HasSuffix(prefix, "classes"),
				strings.HasSuffix(prefix, ".config"):
				p = prefix + ".*"
			case strings.HasSuffix(prefix, "estimated") || strings.HasSuffix(prefix, ".limited") ||
				strings.HasSuffix(prefix, ".dropped") || strings.HasSuffix(prefix, ".dry_run") ||
				strings.HasSuffix(prefix, "negotiation") || strings.HasSuffix(prefix, "invalid") ||
				strings.HasSuffix(prefix, "invalid_dry_run") || strings.HasSuffix(prefix, "verified") ||
				strings.HasSuffix(prefix, ".held"):
				continue
			}
			*out = append(*out, p)
			paths(p, x, out)
		}
	case []any:
		for _, x := range v {
			paths(prefix+"[]", x, out)
		}
	}
}

// TestSchema: the report's JSON is the admin API's schema, which the
// console, the tests and operators' scripts read: a renamed field, or one
// added without its name here, fails (the configuration's are the options'
// names, checked against the table of options in the root package); every
// field survives a strict decoding and encodes back the same.
func TestSchema(t *testing.T) {
	b, err := json.Marshal(full())
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var got View
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decoding the report: %v\n%s", err, b)
	}
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, b) {
		t.Errorf("the report does not survive a round trip:\n%s\n%s", again, b)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	var have []string
	paths("", tree, &have)
	sort.Strings(have)
	have = slices.Compact(have)
	l := "limiters[]."
	want := []string{"limiters",
		l + "name", l + "mode", l + "listeners", l + "limited_streams_total", l + "untracked_drops", l + "attach_errors",
		l + "xdp", l + "xdp[].name", l + "xdp[].attach", l + "xdp[].listeners",
		l + "config", l + "config.*",
		l + "counters", l + "counters.*", l + "counters.*.classes", l + "counters.*.classes.*",
		l + "counters.*.classes.*.passed", l + "counters.*.classes.*.limited", l + "counters.*.classes.*.dropped",
		l + "counters.*.classes.*.dry_run", l + "counters.*.negotiation", l + "counters.*.invalid",
		l + "counters.*.invalid_dry_run", l + "counters.*.allowlisted", l + "counters.*.verified",
		l + "limited_streams", l + "limited_streams[].stream", l + "limited_streams[].class", l + "limited_streams[].reason",
		l + "limited_streams[].level", l + "limited_streams[].rate_pps", l + "limited_streams[].limit_pps",
		l + "limited_streams[].since", l + "limited_streams[].last_drop", l + "limited_streams[].dropped",
		l + "limited_streams[].dry_run",
		l + "opening_total", l + "opening_total.adaptive", l + "opening_total.cap_pps", l + "opening_total.receive_queue_fill",
		l + "opening_total.receive_queue_drops", l + "opening_total.passed_pps",
		l + "established_total", l + "established_total.adaptive", l + "established_total.cap_pps",
		l + "established_total.receive_queue_fill", l + "established_total.receive_queue_drops", l + "established_total.passed_pps",
		l + "verification", l + "verification.on", l + "verification.server_ids", l + "verification.peers",
		l + "verification.odd_ids", l + "verification.credits", l + "verification.proofs", l + "verification.unpaced_attempts",
		l + "verification.held",
		l + "prefilter", l + "prefilter.sockets", l + "prefilter.instructions", l + "prefilter.streams",
		l + "prefilter.drops_invalid", l + "prefilter.invalid_dropped_estimated", l + "prefilter.stream_dropped_estimated",
		l + "prefilter.negotiation_dropped_estimated", l + "prefilter.negotiation_drop_probability",
		l + "prefilter.shed_dropped_estimated", l + "prefilter.shed_drop_probability", l + "prefilter.updates",
		l + "prefilter.attach_errors",
	}
	sort.Strings(want)
	if !slices.Equal(have, want) {
		t.Errorf("the report's fields:\n%s\nwant:\n%s", strings.Join(have, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(string(b), `"window":"1.5s"`) {
		t.Errorf("the window is not written as a duration string: %s", b)
	}
}

// TestLimits: the limits of each class are named as the counters name the
// classes, the opening class "all" without classify.
func TestLimits(t *testing.T) {
	for _, tt := range []struct {
		classify bool
		want     []string
	}{
		{true, []string{ClassOpening, ClassEstablished, ClassUnverified}},
		{false, []string{ClassAll, ClassEstablished, ClassUnverified}},
	} {
		c := Config{Classify: tt.classify, LevelLimits: []uint32{1}, EstablishedLevelLimits: []uint32{2},
			UnverifiedLevelLimits: []uint32{3}}
		var names []string
		for i, cl := range c.Limits() {
			names = append(names, cl.Class)
			if len(cl.Levels) != 1 || cl.Levels[0] != uint32(i+1) {
				t.Errorf("classify %v: class %s has limits %v, want [%d]", tt.classify, cl.Class, cl.Levels, i+1)
			}
		}
		if !slices.Equal(names, tt.want) {
			t.Errorf("classify %v: classes %v, want %v", tt.classify, names, tt.want)
		}
	}
}
