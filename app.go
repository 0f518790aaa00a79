package rakelimit

import (
	"errors"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// App commits the settings of rakelimit wrappers to running limiters when a
// configuration starts. Caddy provisions a new configuration while the old
// one still runs, and may still abandon it; so a wrapper whose limiter
// already serves a socket does not change it in Provision, it queues the
// change here, and Start applies it once the configuration is sure to run.
// If a later app fails to start, Caddy stops this one, and Stop puts the
// previous settings back. Wrappers load the app themselves; it has nothing to
// configure.
type App struct {
	commits []commit
	started []commit
	// servers maps the name of each HTTP server with a rakelimit wrapper
	// to its limiter's name.
	servers map[string]string
	// configs are the configurations this load gives each limiter, by
	// name: two wrappers of one load must agree.
	configs map[string]decide.Config
}

// commit is one queued change: apply puts it in force; revert undoes it if
// nothing newer has replaced it since.
type commit struct {
	apply  func() error
	revert func()
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rakelimit",
		New: func() caddy.Module { return new(App) },
	}
}

// claim records that the limiter called name protects the listeners of the
// server called server, and reports whether it is the server's first
// wrapper. The sites of one server share its sockets and a socket has one
// filter: a second name on one server is an error that names both and the
// listener addresses.
func (a *App) claim(server string, listen []string, name string) (first bool, err error) {
	prev, ok := a.servers[server]
	switch {
	case !ok:
		if a.servers == nil {
			a.servers = map[string]string{}
		}
		a.servers[server] = name
		return true, nil
	case prev != name:
		return false, fmt.Errorf("rakelimit %q and rakelimit %q are both configured on server %s (listening on %s): "+
			"its sites share one UDP socket per listener address, and a socket has one limiter; "+
			"give them the same name, or move one site to another listener address",
			prev, name, server, strings.Join(listen, ", "))
	}
	return false, nil
}

// govern checks that s, whose configuration Provision validated, can
// govern the running limiter l and queues the change for Start.
func (a *App) govern(l *engine.Limiter, s engine.Setting) error {
	name, c := l.Name(), s.Config
	if prev, ok := a.configs[name]; ok && !engine.Equal(prev, c) {
		return fmt.Errorf("rakelimit %q is configured twice in this configuration with different settings "+
			"(limit %d window %v, and limit %d window %v, or other options): sites on one listener must agree; "+
			"limiters that differ need distinct names",
			name, prev.Limiter.Limit, prev.Limiter.Window, c.Limiter.Limit, c.Limiter.Window)
	}
	if err := l.Accepts(s); err != nil {
		return err
	}
	if a.configs == nil {
		a.configs = map[string]decide.Config{}
	}
	a.configs[name] = c
	var prev engine.Setting
	a.commits = append(a.commits, commit{
		apply: func() (err error) {
			prev, err = l.Put(engine.Setting{Config: c, Mode: s.Mode, Logger: s.Logger, By: a})
			return err
		},
		revert: func() { l.Restore(prev, a) },
	})
	return nil
}

// Start applies the queued changes, or none of them.
func (a *App) Start() error {
	for _, c := range a.commits {
		if err := c.apply(); err != nil {
			a.Stop()
			return err
		}
		a.started = append(a.started, c)
	}
	return nil
}

// Stop reverts the changes this configuration applied, unless newer ones
// have replaced them: that restores the previous settings when a reload is
// abandoned after this app started.
func (a *App) Stop() error {
	for i := len(a.started) - 1; i >= 0; i-- {
		a.started[i].revert()
	}
	a.started = nil
	return nil
}

// loadApp returns the rakelimit app of the configuration being provisioned.
func loadApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("rakelimit")
	if err != nil {
		return nil, err
	}
	a, ok := v.(*App)
	if !ok {
		return nil, errors.New("the rakelimit app has an unexpected type")
	}
	return a, nil
}

// Interface guards
var (
	_ caddy.App = (*App)(nil)
)
