//go:build linux

package bpf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestLearnExpire: the public methods learn at the kernel's monotonic time
// and expire by a lifetime; a bad address is refused in one line.
func TestLearnExpire(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	before := monoNow()
	id := datagram.ServerID{9, 8, 7, 6}
	if err := f.LearnServerID(id); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.0.2.1", "::ffff:192.0.2.2", "2001:db8::3"} {
		if err := f.LearnPeer(netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	ids, peers := f.learned(t)
	wantPeer, _ := datagram.PeerKeyOf(netip.MustParseAddr("192.0.2.2"))
	if at := ids[id]; len(ids) != 1 || at < int64(before) || at > int64(monoNow()) || len(peers) != 3 || peers[wantPeer] == 0 {
		t.Fatalf("learned IDs %v and peers %v (clock %d)", ids, peers, before)
	}
	if n, m, err := f.ExpireLearned(time.Hour); err != nil || n != 0 || m != 0 {
		t.Fatalf("ExpireLearned(1h) = %d, %d, %v", n, m, err)
	}
	time.Sleep(10 * time.Millisecond)
	if n, m, err := f.ExpireLearned(5 * time.Millisecond); err != nil || n != 1 || m != 3 {
		t.Fatalf("ExpireLearned(5ms) = %d, %d, %v", n, m, err)
	}
	if ids, peers := f.learned(t); len(ids) != 0 || len(peers) != 0 {
		t.Fatalf("left %v and %v", ids, peers)
	}
	if err := f.LearnPeer(netip.Addr{}); err == nil || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("LearnPeer(invalid): %v", err)
	}
}

// TestLearnedFull: a full set of server IDs takes a new one, evicting
// another, rather than refusing it; and expiry reads every entry of a full
// map.
func TestLearnedFull(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	keys := make([]rakelimitServerId, datagram.MaxServerIDs)
	times := make([]uint64, datagram.MaxServerIDs)
	for i := range keys {
		binary.BigEndian.PutUint32(keys[i].B[:], uint32(i)|0x8000_0000)
		times[i] = 1000
	}
	if _, err := f.objs.ServerIds.BatchUpdate(keys, times, nil); err != nil {
		t.Fatal(err)
	}
	id := datagram.ServerID{1, 2, 3, 4}
	if err := f.learnServerID(id, 2000); err != nil {
		t.Fatalf("a new ID into a full map: %v", err)
	}
	var at uint64
	if err := f.objs.ServerIds.Lookup(rakelimitServerId{B: id}, &at); err != nil || at != 2000 {
		t.Fatalf("the new ID: %d, %v", at, err)
	}
	n, _, err := f.expireLearned(1500)
	if err != nil || n < datagram.MaxServerIDs*9/10 || n >= datagram.MaxServerIDs {
		t.Fatalf("expired %d of about %d old IDs: %v", n, datagram.MaxServerIDs, err)
	}
	if ids, _ := f.learned(t); len(ids) != 1 {
		t.Fatalf("%d IDs left, want the new one", len(ids))
	}
}

// TestLearnedMemory logs what the kernel charges for the learned sets (the
// package doc states it).
func TestLearnedMemory(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	for name, m := range map[string]*ebpf.Map{"server_ids": f.objs.ServerIds, "peers": f.objs.Peers} {
		b := memlock(t, m)
		if b < int(m.MaxEntries()*(m.KeySize()+m.ValueSize())) {
			t.Fatalf("%s: %d bytes charged, less than its keys and values", name, b)
		}
		t.Logf("%s: %d entries of %d+%d bytes: %d bytes (%.1f MiB) charged", name, m.MaxEntries(), m.KeySize(),
			m.ValueSize(), b, float64(b)/(1<<20))
	}
}

// memlock reads the memory the kernel charges for a map from its fdinfo.
func memlock(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	fh, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "memlock:\t%d", &n); err == nil {
			return n
		}
	}
	t.Fatal("no memlock in the map's fdinfo")
	return 0
}

// TestLearnedDimensions: the object's learned sets are LRU hash maps of the
// sizes package datagram gives (load refuses an object that disagrees; this
// checks without loading, so without privileges).
func TestLearnedDimensions(t *testing.T) {
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{rakelimitMapServerIds: datagram.MaxServerIDs, rakelimitMapPeers: datagram.MaxPeers} {
		m := spec.Maps[name]
		if m.Type != ebpf.LRUHash || m.MaxEntries != want {
			t.Errorf("%s: %v of %d entries, want an LRU hash of %d", name, m.Type, m.MaxEntries, want)
		}
	}
	if k := spec.Maps[rakelimitMapPeers].KeySize; k != uint32(4*len(datagram.PeerKey{})) {
		t.Errorf("peers keyed by %d bytes", k)
	}
}

// TestQuickFilters checks the learned sets' quick-reject filters: learning
// a peer or an ID sets its bit, expiring it clears the bit unless a kept
// member shares it, and a rebuild keeps the bits set after its snapshot.
// (That a set bit lets the program find a member, and a clear one spares it
// the lookup, is what the differential tests' learned peers and IDs show:
// a member whose bit were clear would not verify.)
func TestQuickFilters(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	peer := func(s string) datagram.PeerKey {
		k, err := datagram.PeerKeyOf(netip.MustParseAddr(s))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	old, kept := peer("198.51.100.7"), peer("2001:db8::1")
	oldID, keptID := datagram.ServerID{1, 2, 3, 4}, datagram.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
	for _, tt := range []struct {
		name      string
		which     int
		old, kept uint64
		learn     func(at uint64, kept bool) error
	}{
		{"peers", quickPeers, f.peerHash(old), f.peerHash(kept), func(at uint64, k bool) error {
			return f.learnPeer(netip.MustParseAddr(map[bool]string{false: "198.51.100.7", true: "2001:db8::1"}[k]), at)
		}},
		{"server IDs", quickIDs, f.idHash(oldID), f.idHash(keptID), func(at uint64, k bool) error {
			return f.learnServerID(map[bool]datagram.ServerID{false: oldID, true: keptID}[k], at)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if oi, om := quickBit(tt.old); func() bool { ki, km := quickBit(tt.kept); return oi == ki && om == km }() {
				t.Fatalf("the two members share bit %d/%x: pick others", oi, om)
			}
			if f.quickSet(tt.which, tt.old) || f.quickSet(tt.which, tt.kept) {
				t.Fatal("bits set before anything was learned")
			}
			if err := tt.learn(100, false); err != nil {
				t.Fatal(err)
			}
			if err := tt.learn(200, true); err != nil {
				t.Fatal(err)
			}
			if !f.quickSet(tt.which, tt.old) || !f.quickSet(tt.which, tt.kept) {
				t.Fatal("a learned member's bit is clear")
			}
		})
	}
	if ids, peers, err := f.expireLearned(150); err != nil || ids != 1 || peers != 1 {
		t.Fatalf("expired %d IDs and %d peers (%v), want 1 and 1", ids, peers, err)
	}
	for _, c := range []struct {
		which     int
		old, kept uint64
	}{{quickPeers, f.peerHash(old), f.peerHash(kept)}, {quickIDs, f.idHash(oldID), f.idHash(keptID)}} {
		if f.quickSet(c.which, c.old) || !f.quickSet(c.which, c.kept) {
			t.Fatalf("filter %d after expiry: expired member's bit %v (want clear), kept member's %v (want set)", c.which,
				f.quickSet(c.which, c.old), f.quickSet(c.which, c.kept))
		}
	}
	// A member learned during a rebuild, after its snapshot, keeps its bit.
	snap := f.snapQuick(quickPeers)
	during := f.peerHash(peer("203.0.113.9"))
	f.setQuick(quickPeers, during)
	f.rebuildQuick(quickPeers, snap, []uint64{f.peerHash(kept)})
	if !f.quickSet(quickPeers, during) || !f.quickSet(quickPeers, f.peerHash(kept)) {
		t.Fatal("a rebuild cleared the bit of a member learned during it, or of a kept member")
	}
}
