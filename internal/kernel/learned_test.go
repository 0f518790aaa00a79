//go:build linux

package kernel

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestLearnExpire: the public methods learn at the kernel's monotonic time
// and expire by a lifetime; a bad address is refused in one line.
func TestLearnExpire(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	before := monoNow()
	id := decide.ServerID{9, 8, 7, 6}
	if err := f.LearnServerID(id); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.0.2.1", "::ffff:192.0.2.2", "2001:db8::3"} {
		if err := f.LearnPeer(netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	ids, peers := f.learned(t)
	wantPeer, _ := decide.PeerKeyOf(netip.MustParseAddr("192.0.2.2"))
	if st := ids[id]; len(ids) != 1 || st < decide.IDStamp(int64(before)) || st > decide.IDStamp(int64(monoNow())) ||
		len(peers) != 3 || peers[wantPeer] < int64(before) {
		t.Fatalf("learned IDs %v and peers %v (clock %d)", ids, peers, before)
	}
	if n, m, err := f.ExpireLearned(time.Hour); err != nil || n != 0 || m != 0 {
		t.Fatalf("ExpireLearned(1h) = %d, %d, %v", n, m, err)
	}
	// A server ID's time is kept in units of 1.07 s: a cutoff two units
	// on is past it.
	if n, m, err := f.expireLearned(monoNow() + 2<<decide.IDStampShift); err != nil || n != 1 || m != 3 {
		t.Fatalf("expireLearned(2 units on) = %d, %d, %v", n, m, err)
	}
	if ids, peers := f.learned(t); len(ids) != 0 || len(peers) != 0 {
		t.Fatalf("left %v and %v", ids, peers)
	}
	if err := f.LearnPeer(netip.Addr{}); err == nil || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("LearnPeer(invalid): %v", err)
	}
}

// TestLearnedFull: the table holds all but about 1% of MaxServerIDs random
// IDs, learned one after another; a full
// set takes a new ID, evicting its stalest, rather than refusing it; the
// program verifies by every ID the table holds and by no other; and expiry
// reads every slot.
func TestLearnedFull(t *testing.T) {
	c := testutil.QUICLimits(100, 1000)
	c.VerifyIDs = true
	f := loadTest(t, c, loadOptions{testMode: true})
	const unit = uint64(1) << decide.IDStampShift
	rng := rand.New(rand.NewPCG(5, 6))
	ids := make([]decide.ServerID, decide.MaxServerIDs)
	for i := range ids {
		binary.BigEndian.PutUint32(ids[i][:], rng.Uint32())
		// Older IDs first: the stalest are the first learned.
		if err := f.learnServerID(ids[i], (10+uint64(i*8/len(ids)))*unit); err != nil {
			t.Fatal(err)
		}
	}
	held := f.serverIDs()
	if len(held) < decide.MaxServerIDs*98/100 {
		t.Fatalf("the table holds %d of %d random IDs", len(held), len(ids))
	}
	t.Logf("%d of %d random IDs held", len(held), len(ids))
	// A set is full: the new ID evicts the stalest of its set.
	var full int
	var id decide.ServerID
	for {
		binary.BigEndian.PutUint32(id[:], rng.Uint32())
		full = idSetFirst(f.idHash(id))
		used, stalest := 0, int64(math.MaxInt64)
		for i := full; i < full+decide.IDWays; i++ {
			if e := *f.idSlot(i); e&idUsed != 0 {
				used++
				stalest = min(stalest, int64(e&idStampMask))
			}
		}
		if _, known := held[id]; used == decide.IDWays && !known && stalest < 17 {
			break
		}
	}
	before := f.serverIDs()
	if err := f.learnServerID(id, 20*unit); err != nil {
		t.Fatalf("a new ID into a full set: %v", err)
	}
	after := f.serverIDs()
	if after[id] != 20 || len(after) != len(before) {
		t.Fatalf("the new ID: stamp %d, %d IDs held, want 20 and %d", after[id], len(after), len(before))
	}
	for old, st := range before {
		if _, ok := after[old]; !ok && st > after[id] {
			t.Fatalf("evicted ID %x of stamp %d", old, st)
		}
	}
	// The program verifies by the IDs held, and by no other.
	for i, probe := range append(ids[:200:200], id) {
		_, want := after[probe]
		p := udp("192.0.2.1", 50000)
		p.Data = quicclass.ShortPacket(probe, 100)
		v := f.run(t, p.Bytes(), int64(19*unit), 0) // moves a held ID's stamp to 19
		if verified := quicclass.Verification(v.Verified) == quicclass.ShortByID; verified != want {
			t.Fatalf("ID %d (%x), held %v: class %v, verified %v", i, probe, want, quicclass.Class(v.Class),
				quicclass.Verification(v.Verified))
		}
	}
	n, _, err := f.expireLearned(20 * unit)
	if err != nil || n != len(after)-1 {
		t.Fatalf("expired %d of %d old IDs: %v", n, len(after)-1, err)
	}
	if ids, _ := f.learned(t); len(ids) != 1 {
		t.Fatalf("%d IDs left, want the new one", len(ids))
	}
}

// TestLearnedMemory logs what the kernel charges for the learned sets (the
// package doc states it), and checks it is at least their slots.
func TestLearnedMemory(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	for name, m := range map[string]*ebpf.Map{"server_ids": f.objs.ServerIds, "peers": f.objs.Peers} {
		b := memlock(t, m)
		held := m.ValueSize() // an array's keys are its indices
		if m.Type() != ebpf.Array {
			held += m.KeySize()
		}
		if b < int(m.MaxEntries()*held) {
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

// TestLearnedDimensions: the object's learned sets are of the sizes package
// datagram gives, the server IDs an mappable array of sets of IDWays
// slots, the peers an LRU hash (load refuses an object that disagrees; this
// checks without loading, so without privileges).
func TestLearnedDimensions(t *testing.T) {
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	if m := spec.Maps[rakelimitMapServerIds]; m.Type != ebpf.Array || m.Flags&unix.BPF_F_MMAPABLE == 0 ||
		m.MaxEntries != idSets || m.ValueSize != idSetBytes {
		t.Errorf("server_ids: %v of %d values of %d bytes, flags %#x; want a mappable array of %d sets of %d bytes",
			m.Type, m.MaxEntries, m.ValueSize, m.Flags, idSets, idSetBytes)
	}
	if m := spec.Maps[rakelimitMapPeers]; m.Type != ebpf.LRUHash || m.MaxEntries != decide.MaxPeers {
		t.Errorf("peers: %v of %d entries, want an LRU hash of %d", m.Type, m.MaxEntries, decide.MaxPeers)
	}
	if k := spec.Maps[rakelimitMapPeers].KeySize; k != uint32(4*len(decide.PeerKey{})) {
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
	peer := func(s string) decide.PeerKey {
		k, err := decide.PeerKeyOf(netip.MustParseAddr(s))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	old, kept := peer("198.51.100.7"), peer("2001:db8::1")
	oldID, keptID := decide.ServerID{1, 2, 3, 4}, decide.ServerID{0xa1, 0xb2, 0xc3, 0xd4}
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
			return f.learnServerID(map[bool]decide.ServerID{false: oldID, true: keptID}[k], at)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if oi, om := quickBit(tt.old); func() bool { ki, km := quickBit(tt.kept); return oi == ki && om == km }() {
				t.Fatalf("the two members share bit %d/%x: pick others", oi, om)
			}
			if f.quickSet(tt.which, tt.old) || f.quickSet(tt.which, tt.kept) {
				t.Fatal("bits set before anything was learned")
			}
			if err := tt.learn(100<<decide.IDStampShift, false); err != nil {
				t.Fatal(err)
			}
			if err := tt.learn(200<<decide.IDStampShift, true); err != nil {
				t.Fatal(err)
			}
			if !f.quickSet(tt.which, tt.old) || !f.quickSet(tt.which, tt.kept) {
				t.Fatal("a learned member's bit is clear")
			}
		})
	}
	if ids, peers, err := f.expireLearned(150 << decide.IDStampShift); err != nil || ids != 1 || peers != 1 {
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
