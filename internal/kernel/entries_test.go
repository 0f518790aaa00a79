//go:build linux

package kernel

import "testing"

// TestProductionEntriesHaveNoTestCode: the entries production loads read
// neither the time nor the random number a test gives and write no verdict
// for a test (the test_verdict map), and only the test entries do; the
// object's entries are the six c/pkt.h lists. Reading the object needs no
// privilege.
func TestProductionEntriesHaveNoTestCode(t *testing.T) {
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	var production loadOptions
	socket, xdp, err := production.entries()
	if err != nil {
		t.Fatal(err)
	}
	test := loadOptions{testMode: true}
	testSocket, testXDP, err := test.entries()
	if err != nil {
		t.Fatal(err)
	}
	bench := loadOptions{benchRandomSource: true}
	benchSocket, benchXDP, err := bench.entries()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		entry       string
		testVerdict bool
	}{
		{socket, false}, {xdp, false},
		{testSocket, true}, {testXDP, true},
		{benchSocket, false}, {benchXDP, false},
	} {
		prog, ok := spec.Programs[tt.entry]
		if !ok {
			t.Errorf("the object has no entry %s", tt.entry)
			continue
		}
		refs := 0
		for _, ins := range prog.Instructions {
			if ins.Reference() == rakelimitMapTestVerdict {
				refs++
			}
		}
		if got := refs > 0; got != tt.testVerdict {
			t.Errorf("%s refers to %s %d times, want references: %v", tt.entry, rakelimitMapTestVerdict, refs, tt.testVerdict)
		}
	}
	if len(spec.Programs) != 6 {
		t.Errorf("the object has %d entries, want the six of c/pkt.h", len(spec.Programs))
	}
}
