//go:build linux

package kernel

import (
	"bufio"
	"encoding/binary"
	"fmt"
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
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// TestLearnExpire: the public methods learn at the kernel's monotonic time
// and expire by a lifetime; a bad address is refused in one line.
func TestLearnExpire(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	before := monoNow()
	id := decide.ServerID{9, 8, 7, 6}
	to := netip.MustParseAddr("192.0.2.7")
	if err := f.LearnServerID(id, to); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.0.2.7", "::ffff:192.0.2.8", "2001:db8::9"} {
		if err := f.LearnPeer(netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	pk, _ := decide.PeerKeyOf(to)
	i := f.learned.IDs.Find(decide.BoundHash(&f.hk, id, &pk))
	if i < 0 {
		t.Fatal("the learned ID is not in the table")
	}
	if st := uint32(f.learned.IDs.Slot(i)) & decide.StampMask; st < decide.Stamp(int64(before)) || st > decide.Stamp(int64(monoNow())) {
		t.Fatalf("stamp %d, want the kernel's time (%d)", st, decide.Stamp(int64(before)))
	}
	if n, err := f.ExpireLearned(time.Hour); err != nil || n != [decide.NumLearned]int{} {
		t.Fatalf("ExpireLearned(1h) = %v, %v", n, err)
	}
	if n := f.learned.Expire(int64(monoNow())+3<<decide.StampShift, 1); n != [decide.NumLearned]int{1, 0, 3} {
		t.Fatalf("expired %v two stamps past the lifetime, want 1 ID and 3 answered peers", n)
	}
	if err := f.LearnPeer(netip.Addr{}); err == nil || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("LearnPeer(invalid): %v", err)
	}
}

// TestLearnedFull: at and above capacity, the kernel's learned sets and the
// Go twin's forget the same keys. The server binds 1.5 x MaxLearned IDs and
// answers each client (userspace writes both with the same code), and one
// Handshake packet from each client carries its ID, at the proof pacer's
// rate: the program adds the proven peers itself, evicting the stalest of a
// full set as the Go twin does; every slot of the three sets and every
// credit must then agree, and every verdict.
func TestLearnedFull(t *testing.T) {
	c := testutil.QUICLimits(1_000_000, 1_000_000)
	c.VerifyIDs = true
	w := newTwin(t, c)
	const n = decide.MaxLearned * 3 / 2
	rng := rand.New(rand.NewPCG(1, 2))
	type client struct {
		id   decide.ServerID
		addr netip.Addr
	}
	clients := make([]client, n)
	const unit = int64(1) << decide.StampShift
	for i := range clients {
		binary.BigEndian.PutUint32(clients[i].id[:], rng.Uint32())
		clients[i].addr = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		// Stamps rise through the run, so that eviction takes the
		// stalest of a full set.
		w.learnID(clients[i].id, clients[i].addr, (10+int64(i*8/n))*unit)
		w.learnPeer(clients[i].addr, (10+int64(i*8/n))*unit)
	}
	// One Handshake every pacing interval of the proof pacer.
	every := int64(decide.ProofPacing().Interval)
	for i, cl := range clients {
		p := udp(cl.addr.String(), 50000)
		p.Data = quicclasstest.LongPacket(quicclass.Version1, 2, cl.id[:], []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 90)
		w.step(p, p.Datagram(true), 20*unit+int64(i)*every, rng.Uint32())
	}
	w.compareLearned()
	st := w.d.Stats()
	ids, proven := w.d.Learned().IDs.Len(), w.d.Learned().Proven.Len()
	if st.Proofs < decide.MaxLearned || proven < decide.MaxLearned*98/100 || ids < decide.MaxLearned*98/100 {
		t.Fatalf("%d proofs, %d proven peers and %d IDs held of %d", st.Proofs, proven, ids, n)
	}
	t.Logf("%d clients: %d IDs held, %d proofs, %d proven peers held (%d slots)", n, ids, st.Proofs, proven, decide.LearnedSlots)
}

// TestLearnedMemory logs what the kernel charges for the learned sets (the
// package doc states it), and checks it is at least their slots.
func TestLearnedMemory(t *testing.T) {
	f := loadTest(t, testutil.QUICLimits(100, 1000), loadOptions{})
	for name, m := range map[string]*ebpf.Map{"server_ids": f.objs.ServerIds, "proven_peers": f.objs.ProvenPeers,
		"answered_peers": f.objs.AnsweredPeers, "quick": f.objs.Quick} {
		b := memlock(t, m)
		if b < int(m.MaxEntries()*m.ValueSize()) {
			t.Fatalf("%s: %d bytes charged, less than its values", name, b)
		}
		t.Logf("%s: %d entries of %d bytes: %d bytes (%.2f MiB) charged", name, m.MaxEntries(), m.ValueSize(), b,
			float64(b)/(1<<20))
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

// TestLearnedDimensions: the object's learned sets are mappable arrays of
// the sizes package decide gives (load refuses an object that disagrees;
// this checks without loading, so without privileges).
func TestLearnedDimensions(t *testing.T) {
	spec, err := loadRakelimit()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{rakelimitMapServerIds, rakelimitMapProvenPeers, rakelimitMapAnsweredPeers} {
		if m := spec.Maps[name]; m.Type != ebpf.Array || m.Flags&unix.BPF_F_MMAPABLE == 0 ||
			m.MaxEntries != decide.LearnedSets || m.ValueSize != learnedSetBytes {
			t.Errorf("%s: %v of %d values of %d bytes, flags %#x; want a mappable array of %d sets of %d bytes",
				name, m.Type, m.MaxEntries, m.ValueSize, m.Flags, decide.LearnedSets, learnedSetBytes)
		}
	}
	if m := spec.Maps[rakelimitMapQuick]; m.MaxEntries != decide.NumLearned || m.ValueSize != quickBytes {
		t.Errorf("quick: %d values of %d bytes, want %d of %d", m.MaxEntries, m.ValueSize, decide.NumLearned, quickBytes)
	}
}
