//go:build linux

package kernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// stream converts the kernel's record.
func (f *Program) stream(k rakelimitStreamKey, st rakelimitStreamState, mono monoClock) decide.Stream {
	s := decide.Stream{
		Class:    quicclass.Class(k.Class),
		Node:     sketch.Node(k.Node),
		Level:    int(st.Level),
		Key:      sketch.Key{Family: sketch.Family(k.Family), Words: k.Words, SrcPort: k.Sport, DstPort: k.Dport, HasPorts: true},
		First:    mono.wall(st.FirstNs),
		Last:     mono.wall(st.LastNs),
		Drops:    st.SampledDrops << f.trackShift,
		Estimate: st.Estimate,
		DryRun:   st.DryRun != 0,
	}
	if k.Node == decide.InvalidNode {
		s.Class, s.Reason, s.Node, s.Level = quicclass.Invalid, quicclass.Reason(st.Reason), 0, -1
	}
	return s
}

// Streams returns the streams the kernel tracks.
func (f *Program) Streams() ([]decide.Stream, error) {
	mono := newMonoClock()
	var out []decide.Stream
	var k rakelimitStreamKey
	var st rakelimitStreamState
	it := f.objs.Streams.Iterate()
	for it.Next(&k, &st) {
		out = append(out, f.stream(k, st, mono))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading tracked streams: %w", err)
	}
	return out, nil
}

// Untracked estimates the drops of streams the kernel did not track
// because new streams came faster than decide.TrackPacing allows: the
// sampled ones, scaled by the sampling.
func (f *Program) Untracked() (uint64, error) {
	var per []uint64
	if err := f.objs.Untracked.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("reading the untracked drops: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n << f.trackShift, nil
}

// ExpireStreams forgets the streams without a sampled drop for idle and
// returns them: they are no longer limited.
func (f *Program) ExpireStreams(idle time.Duration) ([]decide.Stream, error) {
	mono := newMonoClock()
	var cutoff uint64
	if d := uint64(idle.Nanoseconds()); d < mono.now {
		cutoff = mono.now - d
	}
	var keys []rakelimitStreamKey
	var out []decide.Stream
	var k rakelimitStreamKey
	var st rakelimitStreamState
	it := f.objs.Streams.Iterate()
	for it.Next(&k, &st) {
		if st.LastNs < cutoff {
			keys = append(keys, k)
			out = append(out, f.stream(k, st, mono))
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
	f    *Program
	r    *ringbuf.Reader
	mono monoClock
}

// Events opens a reader of newly limited streams. There is one ring buffer
// per filter: open one reader.
func (f *Program) Events() (*EventReader, error) {
	r, err := ringbuf.NewReader(f.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("opening the event ring buffer: %w", err)
	}
	return &EventReader{f: f, r: r, mono: newMonoClock()}, nil
}

// Read blocks until the kernel reports a stream it started dropping packets
// of, or the reader is closed (the error is then ringbuf.ErrClosed).
func (e *EventReader) Read() (decide.Stream, error) {
	rec, err := e.r.Read()
	if err != nil {
		return decide.Stream{}, err
	}
	var ev struct {
		Key   rakelimitStreamKey
		State rakelimitStreamState
	}
	if len(rec.RawSample) < int(unsafe.Sizeof(ev)) {
		return decide.Stream{}, fmt.Errorf("short event: %d bytes", len(rec.RawSample))
	}
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
		return decide.Stream{}, fmt.Errorf("decoding an event: %w", err)
	}
	return e.f.stream(ev.Key, ev.State, e.mono), nil
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
