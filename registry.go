//go:build linux

package rakelimit

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/bpf"
	"github.com/rakelimit/caddy-rakelimit/internal/sketch"
)

// limiters is the registry of what outlives a configuration: the loaded
// filters, by limiter name, and the sockets they are attached to. Caddy keeps
// a listener's socket across reloads without calling the wrappers again, so
// the filter must outlive the module instance that created it.
var limiters = &limiterRegistry{pool: caddy.NewUsagePool(), owners: map[*net.UDPConn]*limiter{}}

type limiterRegistry struct {
	// pool holds one *limiter per name, counted by the module instances
	// that use it; the last one to go destroys it.
	pool *caddy.UsagePool

	mu sync.Mutex
	// owners maps each attached socket to its limiter.
	owners map[*net.UDPConn]*limiter
}

// limiter is a loaded filter and what it protects.
type limiter struct {
	name   string
	filter *bpf.Filter
	logger *zap.Logger

	mu sync.Mutex
	// cfg is the configuration in force; appliedBy the app that put it
	// there (nil: loaded with it).
	cfg       sketch.Config
	appliedBy *App
	// loadID and loadCfg record the configuration load that last
	// provisioned a wrapper of this name and its settings, to catch two
	// wrappers of one load that disagree.
	loadID  any
	loadCfg sketch.Config
	// conns are the sockets the filter is attached to.
	conns []*net.UDPConn
}

// acquire returns the limiter called name, loading its filter with cfg if it
// does not exist yet. The caller must release it.
func (reg *limiterRegistry) acquire(name string, cfg sketch.Config, logger *zap.Logger) (*limiter, error) {
	v, _, err := reg.pool.LoadOrNew(name, func() (caddy.Destructor, error) {
		f, err := bpf.Load(cfg)
		if err != nil {
			return nil, fmt.Errorf("rakelimit %q: %w", name, err)
		}
		return &limiter{name: name, filter: f, logger: logger, cfg: cfg}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*limiter), nil
}

// release drops one use of the limiter called name.
func (reg *limiterRegistry) release(name string) error {
	_, err := reg.pool.Delete(name)
	return err
}

// provision checks that cfg can govern the limiter in the configuration
// load loadID and queues the change with app.
func (l *limiter) provision(app *App, loadID any, cfg sketch.Config) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loadID == loadID && !sameConfig(l.loadCfg, cfg) {
		return fmt.Errorf("rakelimit %q is configured twice in this configuration with different settings "+
			"(limit %d window %v, and limit %d window %v, or other options): sites on one listener must agree; "+
			"limiters that differ need distinct names", l.name, l.loadCfg.Limit, l.loadCfg.Window, cfg.Limit, cfg.Window)
	}
	next, err := sketch.Compile(cfg)
	if err != nil {
		return err
	}
	if !l.filter.Params().SameShape(next) {
		return fmt.Errorf("rakelimit %q: the number of prefixes and per_destination_port cannot change "+
			"while its listeners run; restart Caddy, or use a new name on a new listener address", l.name)
	}
	l.loadID, l.loadCfg = loadID, cfg
	var prev sketch.Config
	var prevBy *App
	app.queue(commit{
		apply: func() error {
			l.mu.Lock()
			defer l.mu.Unlock()
			if err := l.filter.Update(cfg); err != nil {
				return fmt.Errorf("rakelimit %q: %w", l.name, err)
			}
			prev, prevBy = l.cfg, l.appliedBy
			l.cfg, l.appliedBy = cfg, app
			return nil
		},
		revert: func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.appliedBy != app {
				return // a newer configuration has taken over
			}
			if err := l.filter.Update(prev); err != nil {
				l.logger.Error("restoring the previous settings", zap.String("limiter", l.name), zap.Error(err))
				return
			}
			l.cfg, l.appliedBy = prev, prevBy
		},
	})
	return nil
}

// attach attaches the filter to conn, unless it already is. A socket has
// one filter: one that another limiter protects is left alone.
func (l *limiter) attach(conn *net.UDPConn) (attached bool, err error) {
	limiters.mu.Lock()
	defer limiters.mu.Unlock()
	switch owner := limiters.owners[conn]; {
	case owner == l:
		return false, nil
	case owner != nil:
		return false, fmt.Errorf("the socket is already limited by rakelimit %q", owner.name)
	}
	if err := l.filter.Attach(conn); err != nil {
		return false, err
	}
	limiters.owners[conn] = l
	l.mu.Lock()
	l.conns = append(l.conns, conn)
	l.mu.Unlock()
	return true, nil
}

// Destruct detaches the filter from the sockets that are still open, which
// the wrapper was removed from, and closes it.
func (l *limiter) Destruct() error {
	limiters.mu.Lock()
	for _, c := range l.conns {
		delete(limiters.owners, c)
	}
	limiters.mu.Unlock()
	for _, c := range l.conns {
		if err := bpf.Detach(c); err == nil {
			l.logger.Warn("rakelimit removed from the configuration: listener no longer protected",
				zap.String("limiter", l.name), zap.String("listener", c.LocalAddr().String()))
		} else if !errors.Is(err, net.ErrClosed) {
			l.logger.Debug("detaching", zap.String("limiter", l.name), zap.Error(err))
		}
	}
	return l.filter.Close()
}
