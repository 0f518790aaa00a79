package userspace

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// streamKey is a stream as the kernel keys it (struct stream_key): the
// packet's key reduced to what the dropping node counts, or an invalid
// datagram's source address with node decide.InvalidNode.
type streamKey struct {
	words  [4]uint32
	sport  uint16
	dport  uint16
	family sketch.Family
	node   uint8
	class  quicclass.Class
}

// streamState is what is remembered of a stream (struct stream_state).
type streamState struct {
	first, last int64
	sampled     uint64
	estimate    uint64
	level       int
	dryRun      bool
	reason      quicclass.Reason
}

// streamTable holds up to a fixed number of streams. When it is full, a new
// stream replaces one chosen by the clock (second chance) algorithm: a
// stream with a sampled drop since the hand last passed is spared once, so
// that, like the kernel's LRU map, a flood of new streams evicts streams
// that are no longer dropped before those still dropped. It allocates
// nothing once built.
type streamTable struct {
	index map[streamKey]int32
	slots []streamSlot
	free  []int32
	hand  ClockHand
}

type streamSlot struct {
	key  streamKey
	st   streamState
	used bool
	// ref is set by every sampled drop after the first.
	ref bool
}

func newStreamTable(n int) streamTable {
	t := streamTable{index: make(map[streamKey]int32, n), slots: make([]streamSlot, n), free: make([]int32, n)}
	for i := range t.free {
		t.free[i] = int32(n - 1 - i)
	}
	return t
}

// update counts a sampled drop of stream k if it is tracked, and reports
// whether it is.
func (t *streamTable) update(k *streamKey, init *streamState) bool {
	i, ok := t.index[*k]
	if !ok {
		return false
	}
	s := &t.slots[i]
	s.st.last = init.last
	s.st.sampled++
	s.st.estimate = init.estimate
	s.ref = true
	return true
}

// insert starts tracking stream k, which is not tracked.
func (t *streamTable) insert(k *streamKey, init *streamState) {
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		i = t.evict()
	}
	t.slots[i] = streamSlot{key: *k, st: *init, used: true}
	t.index[*k] = i
}

// evict frees the slot the clock hand settles on; the table is full.
func (t *streamTable) evict() int32 {
	i := t.hand.Victim(len(t.slots), func(i int) bool {
		s := &t.slots[i]
		spared := s.ref
		s.ref = false
		return spared
	})
	delete(t.index, t.slots[i].key)
	t.slots[i].used = false
	return int32(i)
}

// remove forgets the stream in slot i.
func (t *streamTable) remove(i int) {
	delete(t.index, t.slots[i].key)
	t.slots[i] = streamSlot{}
	t.free = append(t.free, int32(i))
}

// streamKeyOf is the stream of node n that the packet k of class class
// belongs to: its source masked to the node's prefix, and its source port
// unless the node leaves it out.
func streamKeyOf(p *sketch.Params, k *sketch.Key, n sketch.Node, class quicclass.Class) streamKey {
	fi := 0
	if k.Family == sketch.IPv6 {
		fi = 1
	}
	sk := streamKey{family: k.Family, node: uint8(n), class: class, dport: k.DstPort}
	for i, m := range p.Mask[fi][n.Prefix()] {
		sk.words[i] = k.Words[i] & m
	}
	if !n.SrcPortAny() {
		sk.sport = k.SrcPort
	}
	return sk
}

// track records a drop of the stream that node out.Verdict.Node saw (track()
// in internal/kernel/c/stream.h).
func (l *Decider) track(k *sketch.Key, out *decide.Outcome, now int64) {
	sk := streamKeyOf(l.f.Limiter().Params(), k, out.Verdict.Node, out.Class)
	st := streamState{first: now, last: now, sampled: 1, estimate: out.Verdict.Estimate, level: out.Verdict.Level,
		dryRun: l.cfg.DryRun}
	l.record(&sk, &st)
}

// MaxFairNetworks bounds the networks the fair total's drops are tracked
// by (FairStreams).
const MaxFairNetworks = 1024

// trackFair records a sampled drop at the fair total (the socket's total,
// whose cap is shared among networks) by the packet's network, the stream
// of the node below the total that counts networks (/24, /48). The kernel
// filter has no such record: it is what the classic BPF pre-filter needs to
// drop the networks that flood in the kernel, since the total's own stream
// (every source) cannot tell them from a quiet one.
func (l *Decider) trackFair(k *sketch.Key, out *decide.Outcome, now int64) {
	p := l.f.Limiter().Params()
	if p.FairNode < 0 || p.FairSource < 0 || out.Verdict.Node != p.Nodes[p.FairNode] {
		return
	}
	n := p.Nodes[p.FairSource]
	sk := streamKeyOf(p, k, n, out.Class)
	st := streamState{first: now, last: now, sampled: 1, level: n.Level(), dryRun: l.cfg.DryRun}
	if !l.fair.update(&sk, &st) {
		l.fair.insert(&sk, &st)
		l.signalTracked()
	}
}

// FairStreams returns the networks the fair total dropped packets of
// recently (sampled as tracked streams are, forgotten as they are by
// ExpireStreams): streams of the node below the total that counts networks,
// with the class of the packets dropped.
func (l *Decider) FairStreams() []decide.Stream {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []decide.Stream
	for i := range l.fair.slots {
		if s := &l.fair.slots[i]; s.used {
			out = append(out, l.stream(&s.key, &s.st))
		}
	}
	return out
}

// trackInvalid records an invalid datagram from k's source address
// (track_invalid() in internal/kernel/c/stream.h).
func (l *Decider) trackInvalid(k *sketch.Key, reason quicclass.Reason, now int64) {
	sk := streamKey{family: k.Family, node: decide.InvalidNode, class: quicclass.Invalid, dport: k.DstPort, words: k.Words}
	st := streamState{first: now, last: now, sampled: 1, reason: reason, dryRun: l.cfg.DryRun}
	l.record(&sk, &st)
}

// record records a sampled drop (record() in internal/kernel/c/stream.h) and reports a
// new stream to the event reader; when the queue is full the report is
// lost, as when the kernel's ring buffer is. New streams are paced
// (decide.TrackPacing); a sampled drop the pacer refuses is counted.
func (l *Decider) record(sk *streamKey, st *streamState) {
	if l.tab.update(sk, st) {
		return
	}
	var ok bool
	if ok, l.trackTAT = l.trackPacing.Admit(l.trackTAT, uint64(st.last)); !ok {
		l.untracked++
		return
	}
	l.tab.insert(sk, st)
	select {
	case l.events <- l.stream(sk, st):
	default:
	}
	l.signalTracked()
}

// signalTracked tells the receiver of Tracked, if it is not told already.
func (l *Decider) signalTracked() {
	select {
	case l.tracked <- struct{}{}:
	default:
	}
}

// Tracked receives when the limiter starts tracking a stream (Streams) or a
// network (FairStreams), once for any number since the last receive, so
// that the owner of the kernel pre-filter can put a new flood in it without
// waiting for its next period.
func (l *Decider) Tracked() <-chan struct{} { return l.tracked }

// stream converts a record (as kernel.Program.stream converts the kernel's).
func (l *Decider) stream(k *streamKey, st *streamState) decide.Stream {
	s := decide.Stream{
		Class:    k.class,
		Node:     sketch.Node(k.node),
		Level:    st.level,
		Key:      sketch.Key{Family: k.family, Words: k.words, SrcPort: k.sport, DstPort: k.dport, HasPorts: true},
		First:    l.clock.wall(st.first),
		Last:     l.clock.wall(st.last),
		Drops:    st.sampled << l.shift,
		Estimate: st.estimate,
		DryRun:   st.dryRun,
	}
	if k.node == decide.InvalidNode {
		s.Class, s.Reason, s.Node, s.Level = quicclass.Invalid, st.reason, 0, -1
	}
	return s
}

// Streams returns the streams tracked now. The error is always nil.
func (l *Decider) Streams() ([]decide.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []decide.Stream
	for i := range l.tab.slots {
		if s := &l.tab.slots[i]; s.used {
			out = append(out, l.stream(&s.key, &s.st))
		}
	}
	return out, nil
}

// Untracked estimates the drops of streams not tracked because new streams
// came faster than decide.TrackPacing allows: the sampled ones, scaled
// by the sampling. The error is always nil.
func (l *Decider) Untracked() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.untracked << l.shift, nil
}

// ExpireStreams forgets the streams without a sampled drop for idle and
// returns them: they are no longer limited. The error is always nil.
func (l *Decider) ExpireStreams(idle time.Duration) ([]decide.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cutoff := l.clock.now() - int64(idle)
	var out []decide.Stream
	for i := range l.tab.slots {
		if s := &l.tab.slots[i]; s.used && s.st.last < cutoff {
			out = append(out, l.stream(&s.key, &s.st))
			l.tab.remove(i)
		}
	}
	for i := range l.fair.slots {
		if s := &l.fair.slots[i]; s.used && s.st.last < cutoff {
			l.fair.remove(i)
		}
	}
	return out, nil
}

// EventReader reads the reports of newly limited streams, one per stream
// the limiter starts tracking.
type EventReader struct {
	l      *Decider
	closed chan struct{}
	once   sync.Once
}

// errReaderOpen refuses a second reader: each report goes to one reader.
var errReaderOpen = errors.New("opening the limited-stream reader: one is already open")

// Events opens the reader of newly limited streams. There is one queue per
// limiter: open one reader at a time.
func (l *Decider) Events() (*EventReader, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return nil, os.ErrClosed
	default:
	}
	if l.reader != nil {
		return nil, errReaderOpen
	}
	l.reader = &EventReader{l: l, closed: make(chan struct{})}
	return l.reader, nil
}

// Read blocks until the limiter starts tracking a stream, or the reader or
// the limiter is closed; the error is then os.ErrClosed (which is what
// ringbuf.ErrClosed is, so one errors.Is serves both filters).
func (e *EventReader) Read() (decide.Stream, error) {
	select {
	case <-e.closed:
		return decide.Stream{}, os.ErrClosed
	case <-e.l.closed:
		return decide.Stream{}, os.ErrClosed
	default:
	}
	select {
	case s := <-e.l.events:
		return s, nil
	case <-e.closed:
	case <-e.l.closed:
	}
	return decide.Stream{}, os.ErrClosed
}

// Close stops the reader; a blocked Read returns. Another reader may then
// be opened.
func (e *EventReader) Close() error {
	e.once.Do(func() {
		close(e.closed)
		e.l.mu.Lock()
		if e.l.reader == e {
			e.l.reader = nil
		}
		e.l.mu.Unlock()
	})
	return nil
}

// Rate returns the current estimate, at s's node, of the packets of stream
// s that reached the limiter: a decayed count per window (as s.Estimate,
// which is the estimate at the stream's latest sampled drop), as of now and
// over both budgets of the node's cells. It is 0 for a stream of invalid
// datagrams, or a node the configuration no longer has.
func (l *Decider) Rate(s *decide.Stream) uint64 {
	if s.Class >= quicclass.LimiterClasses {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.now()
	lim := l.f.Limiter()
	return lim.Estimate(&s.Key, int(s.Class), s.Node, sketch.Clean, now) +
		lim.Estimate(&s.Key, int(s.Class), s.Node, sketch.Limited, now)
}
