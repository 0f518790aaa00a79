package rakelimit

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// limiters is the registry of what outlives a configuration: the running
// limiters, by name, and the sockets they protect. Caddy keeps a listener's
// socket across reloads without calling the wrappers again, so a limiter
// must outlive the module instance that created it. The metrics collector
// and the admin API read it.
var limiters = newPool()

// pool holds the running limiters and the sockets they own.
type pool struct {
	// limiters holds one *pooled per name, counted by the module
	// instances that use it; the last one to go closes it.
	limiters *caddy.UsagePool

	mu sync.Mutex
	// owners maps each protected socket to its limiter.
	owners map[*net.UDPConn]*engine.Limiter

	// collectionErrors counts failed reads of a limiter's counters by the
	// metrics collectors, over every configuration's.
	collectionErrors atomic.Uint64
}

func newPool() *pool {
	return &pool{limiters: caddy.NewUsagePool(), owners: map[*net.UDPConn]*engine.Limiter{}}
}

// pooled is a limiter as the usage pool holds it.
type pooled struct {
	lim  *engine.Limiter
	pool *pool
}

// Destruct forgets the limiter's sockets and closes it: its filter leaves
// the sockets that remain open.
func (pl pooled) Destruct() error {
	pl.pool.mu.Lock()
	for c, l := range pl.pool.owners {
		if l == pl.lim {
			delete(pl.pool.owners, c)
		}
	}
	pl.pool.mu.Unlock()
	return pl.lim.Close()
}

// acquire returns the limiter called name, starting it on c in mode if it
// does not run yet. The caller must release it.
func (p *pool) acquire(name string, c decide.Config, mode string, logger *zap.Logger) (*engine.Limiter, error) {
	v, _, err := p.limiters.LoadOrNew(name, func() (caddy.Destructor, error) {
		l, err := engine.New(name, c, mode, logger)
		if err != nil {
			return nil, err
		}
		return pooled{lim: l, pool: p}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(pooled).lim, nil
}

// release drops one use of the limiter called name.
func (p *pool) release(name string) error {
	_, err := p.limiters.Delete(name)
	return err
}

// each calls fn for every running limiter.
func (p *pool) each(fn func(*engine.Limiter)) {
	p.limiters.Range(func(_, v any) bool {
		fn(v.(pooled).lim)
		return true
	})
}

// named returns the running limiter called name, or nil.
func (p *pool) named(name string) *engine.Limiter {
	var found *engine.Limiter
	p.limiters.Range(func(k, v any) bool {
		if k == name {
			found = v.(pooled).lim
		}
		return true
	})
	return found
}

// attach puts l in front of conn unless it already is, and returns what
// quic-go must read from. A socket has one limiter: one that another limiter
// protects is left alone. A socket l could not protect is l's all the same,
// served through out with the error: a reload may keep it (l attaches again
// then), and removing l frees it.
func (p *pool) attach(l *engine.Limiter, conn *net.UDPConn) (out net.PacketConn, attached bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if owner := p.owners[conn]; owner != nil && owner != l {
		return nil, false, fmt.Errorf("the socket is already limited by rakelimit %q", owner.Name())
	}
	out, attached, err = l.Attach(conn)
	if out != nil {
		p.owners[conn] = l
	}
	return out, attached, err
}

// ownerOf returns the limiter of the open socket that matches, and whether
// there is one; it forgets the sockets closed since they were attached.
func (p *pool) ownerOf(match func(*net.UDPConn) bool) (*engine.Limiter, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var found *engine.Limiter
	for c, l := range p.owners {
		switch {
		case engine.IsClosed(c):
			delete(p.owners, c)
		case found == nil && match(c):
			found = l
		}
	}
	return found, found != nil
}
