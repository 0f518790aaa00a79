// Package engine runs a limiter: it opens the engine that decides datagrams
// (the kernel's BPF socket filter, package kernel, or the userspace limiter in
// front of quic-go, package userspace) in the mode asked for, puts it in front
// of sockets, falls back from BPF to userspace when the filter cannot attach,
// and runs the goroutines that report on it: newly limited streams, streams
// no longer limited, and the hourly sweep of stale sketch cells. It takes a
// logger and knows nothing of Caddy; the Caddy module (the root package)
// pools limiters by name and decides when settings change.
package engine

import (
	"net"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/egress"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace"
)

// Modes a limiter runs in.
const (
	// ModeAuto runs the BPF filter when it loads and attaches, and the
	// userspace limiter otherwise.
	ModeAuto = "auto"
	// ModeBPF runs the BPF filter, or refuses to start.
	ModeBPF = "bpf"
	// ModeUserspace runs the userspace limiter and never tries BPF.
	ModeUserspace = "userspace"
)

// ValidMode reports whether mode is one of the modes a limiter can be asked
// for.
func ValidMode(mode string) bool {
	return mode == ModeAuto || mode == ModeBPF || mode == ModeUserspace
}

// Engine is what a limiter runs on: the kernel's BPF socket filter or the
// userspace limiter in front of quic-go. Both decide with the same algorithm,
// configuration and counters.
type Engine interface {
	// Mode is ModeBPF or ModeUserspace.
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
	Protect(conn *net.UDPConn, read *userspace.Conn) error
	// Sink learns the server's connection IDs and peers (from the
	// learner Protect's conns teach); ExpireLearned forgets those unused
	// for lifetime.
	egress.Sink
	ExpireLearned(lifetime time.Duration) (ids, peers int, err error)
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

// Open opens the engine of mode for c: for ModeAuto the BPF filter when it
// loads, else the userspace limiter, and then fallback is the error that
// kept BPF from being used.
func Open(mode string, c decide.Config) (e Engine, fallback error, err error) {
	if mode != ModeUserspace {
		k, err := OpenKernel(c)
		switch {
		case err == nil:
			return k, nil, nil
		case mode == ModeBPF:
			return nil, nil, err
		}
		fallback = err
	}
	u, err := OpenUserspace(c)
	if err != nil {
		return nil, nil, err
	}
	return u, fallback, nil
}
