package rakelimit

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
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

// engine is what a limiter runs on: the kernel's BPF socket filter or the
// userspace limiter in front of quic-go. Both decide with the same algorithm,
// settings and counters.
type engine interface {
	// mode is ModeBPF or ModeUserspace.
	mode() string
	// Configure puts a configuration in force, all or nothing.
	Configure(datagram.Config) error
	Params() *sketch.Params
	Stats() (datagram.Stats, error)
	Streams() ([]datagram.Stream, error)
	ExpireStreams(idle time.Duration) ([]datagram.Stream, error)
	Sweep() (int, error)
	// events opens the reader of newly limited streams; its Read returns an
	// error that is os.ErrClosed once it is closed.
	events() (eventReader, error)
	// protect puts the filter in front of the socket and returns what
	// quic-go must read from.
	protect(conn *net.UDPConn) (net.PacketConn, error)
	// unprotect takes the filter away from a socket that stays open: the
	// directive was removed. It reports false when the socket is closed.
	unprotect(conn *net.UDPConn) (bool, error)
	Close() error
}

// eventReader reads the reports of newly limited streams.
type eventReader interface {
	Read() (datagram.Stream, error)
	Close() error
}

// userEngine is the userspace limiter, with the packet conns it filters.
type userEngine struct {
	*userspace.Limiter

	mu    sync.Mutex
	conns map[*net.UDPConn]*userspace.Conn
}

func newUserEngine(c datagram.Config) (*userEngine, error) {
	l, err := userspace.New(c)
	if err != nil {
		return nil, err
	}
	return &userEngine{Limiter: l, conns: map[*net.UDPConn]*userspace.Conn{}}, nil
}

func (e *userEngine) mode() string { return ModeUserspace }

func (e *userEngine) events() (eventReader, error) { return e.Events() }

// protect wraps the socket in a conn that decides every datagram before
// quic-go reads it; the conn keeps quic-go's batched reads, GSO and ECN (see
// package userspace).
func (e *userEngine) protect(conn *net.UDPConn) (net.PacketConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.conns[conn]; ok {
		return c, nil
	}
	c, err := userspace.NewConn(conn, e.Limiter)
	if err != nil {
		return nil, fmt.Errorf("wrapping the socket: %w", err)
	}
	e.conns[conn] = c
	return c, nil
}

// unprotect lets every datagram through the socket's conn: quic-go keeps
// reading through it until the socket closes.
func (e *userEngine) unprotect(conn *net.UDPConn) (bool, error) {
	e.mu.Lock()
	c, ok := e.conns[conn]
	delete(e.conns, conn)
	e.mu.Unlock()
	if !ok {
		return false, errors.New("not a socket of this limiter")
	}
	c.SetLimiter(nil)
	return !isClosed(conn), nil
}

// openEngine opens the engine of mode for s: for ModeAuto the BPF filter
// when it loads, else the userspace limiter and the reason BPF was not used
// (fallback is then the error that made it fall back).
func openEngine(mode string, s settings) (e engine, fallback error, err error) {
	if mode != ModeUserspace {
		k, err := loadKernel(s)
		switch {
		case err == nil:
			return k, nil, nil
		case mode == ModeBPF:
			return nil, nil, err
		}
		fallback = err
	}
	u, err := newUserEngine(datagram.Config(s))
	if err != nil {
		return nil, nil, err
	}
	return u, fallback, nil
}
