//go:build linux

package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// DefaultTrackShift is the default sampling of drops for stream tracking:
// one drop in 2^4 looks the stream up in the kernel's tracking map.
const DefaultTrackShift = 4

// Options are the filter's settings beyond the limiter's. They change what
// happens to the limiter's verdicts, not how it reaches them.
type Options struct {
	// DryRun delivers every packet; drops are counted (Stats.WouldDrop)
	// and tracked, not applied.
	DryRun bool
	// Allow exempts these source prefixes from limiting and counting.
	Allow []netip.Prefix
	// TrackShift samples one drop in 2^TrackShift for stream tracking;
	// 0 tracks every drop.
	TrackShift uint8
}

// SetOptions applies o to the live filter and keeps the limiter
// configuration; see Configure.
func (f *Filter) SetOptions(o Options) error {
	f.mu.Lock()
	p := f.params
	f.mu.Unlock()
	return f.configure(p, o)
}

// AllowEntries counts the prefixes in the kernel's allowlist.
func (f *Filter) AllowEntries() (int, error) {
	n := 0
	var k rakelimitAllowKey
	var v uint8
	it := f.objs.Allowlist.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading the allowlist: %w", err)
	}
	return n, nil
}

// trackShift is the sampling of drops in force.
func (f *Filter) trackShift() uint8 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opts.TrackShift
}

// The allowlist's quick-reject filter, as in rakelimit.c: a bit per bucket
// of a multiplicative hash of an address's top 16 (IPv4) or 32 (IPv6) bits.
const (
	allowFilterShift = 10
	allowFilterBits  = 1 << allowFilterShift
	allowHashMul     = 0x9E3779B1
)

// allowBucket is the bucket of an address's top bits.
func allowBucket(top uint32) uint32 { return top * allowHashMul >> (32 - allowFilterShift) }

// allowFilter computes, per family, the buckets the prefixes cover, or that
// a family's prefixes are too short to enumerate (always look up).
func allowFilter(prefixes []netip.Prefix) (filter [2][allowFilterBits / 64]uint64, always [2]uint8) {
	for _, p := range prefixes {
		fi, topBits := 0, 16
		if p.Addr().Is6() {
			fi, topBits = 1, 32
		}
		b := p.Addr().As16()
		off := 12
		if fi == 1 {
			off = 0
		}
		word := binary.BigEndian.Uint32(b[off:])
		top := word >> (32 - topBits)
		if p.Bits() >= topBits {
			n := allowBucket(top)
			filter[fi][n/64] |= 1 << (n % 64)
			continue
		}
		span := topBits - p.Bits()
		if span > allowFilterShift {
			always[fi] = 1 // covers more tops than there are buckets
			continue
		}
		first := top &^ (1<<span - 1)
		for t := first; t < first+1<<span; t++ {
			n := allowBucket(t)
			filter[fi][n/64] |= 1 << (n % 64)
		}
	}
	return filter, always
}

// allowKey is the allowlist key of a prefix: IPv4 mapped into ::ffff:0:0/96.
func allowKey(p netip.Prefix) rakelimitAllowKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return rakelimitAllowKey{Prefixlen: uint32(bits), Addr: p.Addr().As16()}
}

// Stream is a stream the filter has recently dropped packets of, as the
// lattice node that dropped them counts it.
type Stream struct {
	// Node and Level are the lattice node that dropped the packets.
	Node  sketch.Node
	Level int
	// Key is the stream: the packet's key reduced to the node (address
	// masked to its prefix, ports the node ignores set to zero; the
	// destination port is kept).
	Key sketch.Key
	// First and Last are the first and the latest sampled drop.
	First, Last time.Time
	// Drops estimates the packets dropped: sampled drops times the
	// sampling rate.
	Drops uint64
	// Estimate is the node's rate estimate at the latest sampled drop, a
	// decayed count per window, Q24 (sketch.Limiter.PPS converts it).
	Estimate uint64
	// DryRun is true when the drops were not applied.
	DryRun bool
}

// stream converts the kernel's record; shift is the drop sampling in force.
func stream(k rakelimitStreamKey, st rakelimitStreamState, mono monoClock, shift uint8) Stream {
	key := sketch.Key{Family: sketch.Family(k.Family), Words: k.Words, SrcPort: k.Sport, DstPort: k.Dport,
		HasPorts: true}
	return Stream{
		Node:     sketch.Node(k.Node),
		Level:    int(st.Level),
		Key:      key,
		First:    mono.wall(st.FirstNs),
		Last:     mono.wall(st.LastNs),
		Drops:    st.SampledDrops << shift,
		Estimate: st.Estimate,
		DryRun:   st.DryRun != 0,
	}
}

// Streams returns the streams the kernel tracks.
func (f *Filter) Streams() ([]Stream, error) {
	mono, shift := newMonoClock(), f.trackShift()
	var out []Stream
	var k rakelimitStreamKey
	var st rakelimitStreamState
	it := f.objs.Streams.Iterate()
	for it.Next(&k, &st) {
		out = append(out, stream(k, st, mono, shift))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading tracked streams: %w", err)
	}
	return out, nil
}

// ExpireStreams forgets the streams without a sampled drop for idle and
// returns them: they are no longer limited.
func (f *Filter) ExpireStreams(idle time.Duration) ([]Stream, error) {
	mono, shift := newMonoClock(), f.trackShift()
	var cutoff uint64
	if d := uint64(idle.Nanoseconds()); d < mono.now {
		cutoff = mono.now - d
	}
	var keys []rakelimitStreamKey
	var out []Stream
	var k rakelimitStreamKey
	var st rakelimitStreamState
	it := f.objs.Streams.Iterate()
	for it.Next(&k, &st) {
		if st.LastNs < cutoff {
			keys = append(keys, k)
			out = append(out, stream(k, st, mono, shift))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading tracked streams: %w", err)
	}
	for _, k := range keys {
		if err := f.objs.Streams.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, fmt.Errorf("forgetting a stream: %w", err)
		}
	}
	return out, nil
}

// EventReader reads the kernel's reports of newly limited streams.
type EventReader struct {
	f    *Filter
	r    *ringbuf.Reader
	mono monoClock
}

// Events opens a reader of newly limited streams. There is one ring buffer
// per filter: open one reader.
func (f *Filter) Events() (*EventReader, error) {
	r, err := ringbuf.NewReader(f.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("opening the event ring buffer: %w", err)
	}
	return &EventReader{f: f, r: r, mono: newMonoClock()}, nil
}

// Read blocks until the kernel reports a stream it started dropping packets
// of, or the reader is closed (the error is then ringbuf.ErrClosed).
func (e *EventReader) Read() (Stream, error) {
	rec, err := e.r.Read()
	if err != nil {
		return Stream{}, err
	}
	var ev struct {
		Key   rakelimitStreamKey
		State rakelimitStreamState
	}
	if len(rec.RawSample) < int(unsafe.Sizeof(ev)) {
		return Stream{}, fmt.Errorf("short event: %d bytes", len(rec.RawSample))
	}
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
		return Stream{}, fmt.Errorf("decoding an event: %w", err)
	}
	return stream(ev.Key, ev.State, e.mono, e.f.trackShift()), nil
}

// Close stops the reader; a blocked Read returns.
func (e *EventReader) Close() error { return e.r.Close() }

// monoClock converts the kernel's monotonic nanoseconds to wall time.
type monoClock struct {
	now uint64
	at  time.Time
}

func newMonoClock() monoClock {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return monoClock{now: uint64(ts.Nano()), at: time.Now()}
}

func (m monoClock) wall(ns uint64) time.Time {
	return m.at.Add(-time.Duration(m.now - ns))
}
