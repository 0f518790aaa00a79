package rakelimit

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// limiters is the one state of the module that outlives a configuration, as
// Caddy demands: Caddy keeps a listener's socket across reloads without
// calling the wrappers again, so a limiter must outlive the module instance
// that started it. The module instances count their uses of each limiter
// here; the engine's registry holds the limiters and the sockets they own,
// and the admin API and the metrics collector read it.
var limiters = newPool()

// pool counts the module instances that use each limiter.
type pool struct {
	// uses holds one *pooled per name, counted by the module instances
	// that use it; the first starts the limiter, the last to go closes
	// it.
	uses *caddy.UsagePool
	// registry holds the running limiters and the sockets each owns.
	registry *engine.Registry
	// metrics is the collector of every running limiter, registered with
	// each configuration's metrics registry.
	metrics *collector
}

func newPool() *pool {
	reg := engine.NewRegistry()
	return &pool{uses: caddy.NewUsagePool(), registry: reg, metrics: newCollector(reg)}
}

// pooled is a limiter as the usage pool holds it.
type pooled struct {
	lim      *engine.Limiter
	registry *engine.Registry
}

// Destruct closes the limiter: its filter leaves the sockets that remain
// open.
func (pl pooled) Destruct() error { return pl.registry.Close(pl.lim) }

// acquire returns the limiter called name, starting it with s (its
// configuration, mode, options and logger) if it does not run yet: a
// running one keeps its engine, and with it its program, its links to
// interfaces and its state. The caller must release it.
func (p *pool) acquire(name string, s engine.Setting) (*engine.Limiter, error) {
	v, _, err := p.uses.LoadOrNew(name, func() (caddy.Destructor, error) {
		l, err := p.registry.StartWith(name, s)
		if err != nil {
			return nil, err
		}
		return pooled{lim: l, registry: p.registry}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(pooled).lim, nil
}

// release drops one use of the limiter called name.
func (p *pool) release(name string) error {
	_, err := p.uses.Delete(name)
	return err
}
