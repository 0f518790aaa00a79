//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
)

// LearnServerID remembers id, a connection ID the server put in a long
// header's source connection ID, at the kernel's monotonic time: with
// VerifyIDs, datagrams to it are verified from now on. Safe for concurrent
// use.
func (f *Filter) LearnServerID(id datagram.ServerID) error {
	return f.learnServerID(id, monoNow())
}

func (f *Filter) learnServerID(id datagram.ServerID, at uint64) error {
	if err := f.objs.ServerIds.Update(rakelimitServerId{B: id}, at, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("learning server connection ID %x: %w", id[:], err)
	}
	return nil
}

// LearnPeer remembers addr, an address the server sent a datagram to, at
// the kernel's monotonic time. Safe for concurrent use.
func (f *Filter) LearnPeer(addr netip.Addr) error {
	return f.learnPeer(addr, monoNow())
}

func (f *Filter) learnPeer(addr netip.Addr, at uint64) error {
	k, err := datagram.PeerKeyOf(addr)
	if err != nil {
		return err
	}
	if err := f.objs.Peers.Update(rakelimitPeerKey{Words: k}, at, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("learning peer %v: %w", addr, err)
	}
	return nil
}

// ExpireLearned forgets the server IDs and peers neither learned nor (for
// an ID) used by a verified datagram for lifetime, and returns how many of
// each. Safe for concurrent use. An ID that a datagram refreshes between
// the check of its time and its deletion (two system calls apart) is lost;
// its connection's short headers are then verified by the peer address.
func (f *Filter) ExpireLearned(lifetime time.Duration) (ids, peers int, err error) {
	now := monoNow()
	var cutoff uint64
	if d := uint64(max(lifetime, 0).Nanoseconds()); d < now {
		cutoff = now - d
	}
	return f.expireLearned(cutoff)
}

func (f *Filter) expireLearned(cutoff uint64) (ids, peers int, err error) {
	if ids, err = expireBefore[rakelimitServerId](f.objs.ServerIds, cutoff); err != nil {
		return ids, 0, fmt.Errorf("expiring server connection IDs: %w", err)
	}
	if peers, err = expireBefore[rakelimitPeerKey](f.objs.Peers, cutoff); err != nil {
		return ids, peers, fmt.Errorf("expiring peers: %w", err)
	}
	return ids, peers, nil
}

// expireChunk is how many entries one batch lookup reads.
const expireChunk = 4096

// expireBefore deletes the entries of m, a hash of K to a time, whose time
// is before cutoff, and returns how many. It reads the map in batches, and
// checks each candidate's time again just before deleting it, so that only
// a refresh in the moment between the two is lost.
func expireBefore[K comparable](m *ebpf.Map, cutoff uint64) (int, error) {
	keys, times := make([]K, expireChunk), make([]uint64, expireChunk)
	var old []K
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, times, nil)
		for i := range n {
			if times[i] < cutoff {
				old = append(old, keys[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("reading: %w", err)
		}
	}
	deleted := 0
	for _, k := range old {
		var t uint64
		if err := m.Lookup(k, &t); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return deleted, fmt.Errorf("reading: %w", err)
		}
		if t >= cutoff {
			continue
		}
		if err := m.Delete(k); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return deleted, fmt.Errorf("deleting: %w", err)
		}
		deleted++
	}
	return deleted, nil
}

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns (and, at
// the timer tick's resolution, of bpf_ktime_get_coarse_ns).
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
