package rakelimit

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/console"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// TestConsoleReadsAdminView checks that the console's types read every
// field the admin view serves: a field added to admin.go and not to
// internal/console fails here.
func TestConsoleReadsAdminView(t *testing.T) {
	v := view{Limiters: []viewLimiter{{
		Name: "default", Mode: engine.ModeBPF, Listeners: []string{"[::]:443"},
		Config: viewConfig{Limit: 1000, Window: "1s", Classify: true, LevelLimits: []uint32{1, 2}, EstablishedLevelLimits: []uint32{3, 0},
			IPv4Prefixes: []int{32, 0}, IPv6Prefixes: []int{64, 0}, BlockSourcePorts: []string{"0-1023"}, Allow: []string{"192.0.2.0/24"}},
		Counters: map[string]viewCounters{"ipv4": {Classes: map[string]viewClassCounters{"opening": {Passed: 7,
			Limited: map[string]uint64{"0": 1}, Dropped: map[string]uint64{"0": 2}, DryRun: map[string]uint64{"0": 3}}},
			Negotiation: map[string]uint64{"passed": 1}, Invalid: map[string]uint64{"empty": 1},
			InvalidDryRun: map[string]uint64{"empty": 2}, Allowlisted: 4, Verified: map[string]uint64{"short_by_id": 5}}},
		LimitedStreams: []viewStream{{Stream: "127.0.0.6/32 sport=1 -> :443", Class: "opening", Level: 0, RatePPS: 5,
			LimitPPS: 1000, Since: time.Unix(1, 0).UTC(), LastDrop: time.Unix(2, 0).UTC(), Dropped: 9, DryRun: true}},
		LimitedStreamsTotal: 1,
		OpeningTotal:        viewOpeningTotal{Adaptive: true, CapPPS: 20000, QueueFill: 0.5, QueueDrops: 3, OpenedPPS: 9},
		Verification:        viewVerification{On: true, ServerIDs: 1, Peers: 2, OddIDs: 3},
	}}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var got console.View
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("the console cannot read the admin view: %v\n%s", err, b)
	}
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, b) {
		t.Errorf("the console's view differs from the admin's:\n%s\n%s", again, b)
	}
}
