// Package engine runs a limiter: it opens the engine that decides datagrams
// in the mode asked for (the table of modes, modes.go): the BPF program of
// package kernel at the driver (mode xdp: its XDP program, with the socket
// filter behind it) or on the sockets (mode bpf), or the userspace limiter
// in front of quic-go (package userspace); puts it in front of sockets,
// falls back down a chain (mode auto: XDP, the socket filter, userspace)
// when an engine cannot attach; feeds it what the server sends (package
// learn, under the conn quic-go reads and writes through, package
// packetconn); moves the opening and established totals with the receive
// queues (total.go, package backlog); and runs the goroutines that report
// on it: newly limited streams, streams no longer limited, the expiry of
// what was learned, and the hourly sweep of stale sketch cells. Report
// reads a limiter into one snapshot (package report) that the admin view,
// the metrics and the console all render; a Registry holds the running
// limiters by name and the sockets each owns. It takes a logger and knows
// nothing of Caddy; the Caddy module (the root package) counts the uses of
// each limiter across reloads and decides when settings change.
package engine

import (
	"fmt"
	"net"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
)

// Engine is what a limiter runs on: the kernel's BPF socket filter or the
// userspace limiter in front of quic-go. Both decide with the same algorithm,
// configuration and counters.
type Engine interface {
	// Mode is the name of the concrete mode the engine runs in (a row
	// of the table of modes): ModeBPF or ModeUserspace.
	Mode() string
	// Configure puts a configuration in force, all or nothing.
	Configure(decide.Config) error
	// Params is the compiled configuration in force.
	Params() *sketch.Params
	// Stats reads the datagram counters.
	Stats() (decide.Stats, error)
	// Streams lists the streams with recent drops.
	Streams() ([]decide.Stream, error)
	// Untracked estimates the drops of streams left untracked because new
	// streams came faster than decide.TrackPacing allows.
	Untracked() (uint64, error)
	// ExpireStreams forgets the streams without a drop for idle and
	// returns them.
	ExpireStreams(idle time.Duration) ([]decide.Stream, error)
	// Sweep resets the sketch cells idle for so long that their epoch
	// could wrap.
	Sweep() (int, error)
	// Events opens the reader of newly limited streams.
	Events() (EventReader, error)
	// Protect puts the filter in front of the socket, whose reads go
	// through read (the conn the limiter gave quic-go, which passes every
	// datagram until an engine decides them): the kernel filter attaches
	// to the socket, the userspace limiter decides read's datagrams.
	Protect(conn *net.UDPConn, read ReadConn) error
	// Sink learns the server's connection IDs and peers (from the
	// learner Protect's conns teach); ExpireLearned forgets the keys of
	// each learned set unused for lifetime. Learned is the learned sets,
	// and AdoptLearned takes over another engine's (stamped now), which
	// must hash with the same key (HashKey; Options.HashKey opens an
	// engine on one).
	learn.Sink
	ExpireLearned(lifetime time.Duration) ([decide.NumLearned]int, error)
	Learned() decide.Learned
	AdoptLearned(from decide.Learned)
	HashKey() sketch.HashKey
	// Unprotect takes the filter away from a socket that stays open (the
	// limiter was removed, or moved to userspace). It reports false when
	// the socket is closed.
	Unprotect(conn *net.UDPConn) (bool, error)
	// Close releases the engine.
	Close() error
}

// EventReader reads the reports of newly limited streams. Read returns an
// error that is os.ErrClosed once the reader is closed.
type EventReader interface {
	Read() (decide.Stream, error)
	Close() error
}

// ReadConn is what an engine is given of the conn quic-go reads a socket
// through: a packet conn over the socket (Unwrap returns it) that passes
// every datagram until an engine that decides in userspace takes its reads.
// The limiter gives quic-go one per socket, a packetconn.Conn, which
// embeds the *net.UDPConn so that quic-go keeps its fast path (batched
// reads, GSO, ECN), and hands it to the engine in force with the socket; an
// engine that decides in the kernel leaves it alone, and one that decides
// in userspace sets itself as its Decider.
type ReadConn interface {
	net.PacketConn
	// Unwrap returns the socket, a *net.UDPConn.
	Unwrap() net.PacketConn
}

// Skipped is a concrete mode a chain tried and could not open, with the
// error that kept it from opening.
type Skipped struct {
	Mode Mode
	Err  error
}

// Open opens the engine of the mode called mode for c and o: a concrete
// mode's own, or the first of a chain's modes (TriesWith) that opens;
// skipped are the modes tried before it, each with its error. When none
// opens, err is the error of the last one tried.
func Open(mode string, c decide.Config, o Options) (e Engine, skipped []Skipped, err error) {
	tries := TriesWith(mode, o)
	if len(tries) == 0 {
		return nil, nil, fmt.Errorf("mode %q: want %s", mode, ModeChoices())
	}
	last := len(tries) - 1
	for _, m := range tries[:last] {
		e, err := m.Open(c, o)
		if err == nil {
			return e, skipped, nil
		}
		skipped = append(skipped, Skipped{Mode: m, Err: err})
	}
	if e, err = tries[last].Open(c, o); err != nil {
		return nil, nil, err
	}
	return e, skipped, nil
}
