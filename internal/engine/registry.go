package engine

import (
	"fmt"
	"net"
	"sort"
	"sync"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Registry holds the running limiters by name and the sockets each owns: a
// socket has one limiter. Start and Close bracket a limiter's life in it;
// the views read every limiter through it. It is safe for concurrent use.
type Registry struct {
	mu sync.Mutex
	// limiters holds the running limiter of each name. A limiter
	// started under the name of one not yet closed replaces it here.
	limiters map[string]*Limiter
	// owners maps each socket handed to a limiter to it.
	owners map[*net.UDPConn]*Limiter
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{limiters: map[string]*Limiter{}, owners: map[*net.UDPConn]*Limiter{}}
}

// Start starts the limiter called name on c in mode (New) and holds it.
func (r *Registry) Start(name string, c decide.Config, mode string, logger *zap.Logger) (*Limiter, error) {
	return r.StartWith(name, Setting{Config: c, Mode: mode, Logger: logger})
}

// StartWith starts the limiter called name with the setting s (NewWith)
// and holds it.
func (r *Registry) StartWith(name string, s Setting) (*Limiter, error) {
	l, err := NewWith(name, s)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limiters[name] = l
	return l, nil
}

// Close forgets l and the sockets it owns, and closes it: its engine leaves
// the sockets that remain open.
func (r *Registry) Close(l *Limiter) error {
	r.mu.Lock()
	if r.limiters[l.Name()] == l {
		delete(r.limiters, l.Name())
	}
	for c, owner := range r.owners {
		if owner == l {
			delete(r.owners, c)
		}
	}
	r.mu.Unlock()
	return l.Close()
}

// Named returns the running limiter called name, or nil.
func (r *Registry) Named(name string) *Limiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limiters[name]
}

// Limiters returns the running limiters, by name.
func (r *Registry) Limiters() []*Limiter {
	r.mu.Lock()
	out := make([]*Limiter, 0, len(r.limiters))
	for _, l := range r.limiters {
		out = append(out, l)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Attach puts l in front of conn unless it already is (Limiter.Attach), and
// returns what quic-go must read from. A socket has one limiter: one that
// another limiter owns is left alone, with an error. A socket l could not
// protect is l's all the same, served through out with the error: a reload
// may keep it (l attaches again then), and closing l frees it.
func (r *Registry) Attach(l *Limiter, conn *net.UDPConn) (out net.PacketConn, attached bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if owner := r.owners[conn]; owner != nil && owner != l {
		return nil, false, fmt.Errorf("the socket is already limited by rakelimit %q", owner.Name())
	}
	out, attached, err = l.Attach(conn)
	if out != nil {
		r.owners[conn] = l
	}
	return out, attached, err
}

// Owner returns the limiter of the open socket that matches, and whether
// there is one; it forgets the sockets closed since they were attached.
func (r *Registry) Owner(match func(*net.UDPConn) bool) (*Limiter, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found *Limiter
	for c, l := range r.owners {
		switch {
		case IsClosed(c):
			delete(r.owners, c)
		case found == nil && match(c):
			found = l
		}
	}
	return found, found != nil
}

// Report reads every running limiter (Limiter.Report), by name. On an error
// it returns every report with the first error, which names its limiter.
func (r *Registry) Report() (report.View, error) {
	v := report.View{Limiters: []report.Limiter{}}
	var first error
	for _, l := range r.Limiters() {
		lr, err := l.Report()
		if err != nil && first == nil {
			first = fmt.Errorf("limiter %q: %w", l.Name(), err)
		}
		v.Limiters = append(v.Limiters, lr)
	}
	return v, first
}
