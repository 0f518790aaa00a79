package engine

import (
	"errors"
	"net"
	"sync"

	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
	"github.com/rakelimit/caddy-rakelimit/internal/userspace"
)

// userEngine is the userspace limiter, with the packet conns it filters.
type userEngine struct {
	*userspace.Limiter

	mu    sync.Mutex
	conns map[*net.UDPConn]*userspace.Conn
}

// OpenUserspace opens the userspace limiter for c.
func OpenUserspace(c datagram.Config) (Engine, error) {
	l, err := userspace.New(c)
	if err != nil {
		return nil, err
	}
	return &userEngine{Limiter: l, conns: map[*net.UDPConn]*userspace.Conn{}}, nil
}

func (e *userEngine) Mode() string { return ModeUserspace }

func (e *userEngine) Events() (EventReader, error) { return e.Limiter.Events() }

// Protect makes the userspace limiter decide every datagram quic-go reads
// through read, the socket's conn, which keeps quic-go's batched reads, GSO
// and ECN (see package userspace).
func (e *userEngine) Protect(conn *net.UDPConn, read *userspace.Conn) error {
	if read == nil {
		return errors.New("no conn to filter the socket's reads")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.conns[conn] = read
	read.SetLimiter(e.Limiter)
	return nil
}

// Unprotect lets every datagram through the socket's conn: quic-go keeps
// reading through it until the socket closes.
func (e *userEngine) Unprotect(conn *net.UDPConn) (bool, error) {
	e.mu.Lock()
	c, ok := e.conns[conn]
	delete(e.conns, conn)
	e.mu.Unlock()
	if !ok {
		return false, errors.New("not a socket of this limiter")
	}
	c.SetLimiter(nil)
	return !IsClosed(conn), nil
}

// IsClosed reports whether conn's socket has been closed.
func IsClosed(conn *net.UDPConn) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}
